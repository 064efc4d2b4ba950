"""The per-call context every layer sees: the request to replay, the tier, the deadlines,
the phase record and the attempts' results."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmguard_client._config import Tier
from llmguard_client._replicas import ReplicaState
from llmguard_client.layers.budget import RetryBudget
from llmguard_client.telemetry.hooks import CallObservation
from llmguard_client.telemetry.record import AttemptRecord, PhaseRecord

TIER_HEADER = "x-llmguard-tier"
COHORT_HEADER = "x-llmguard-cohort"
CAUSE_HEADER = "x-llmguard-cause"
_STRIPPED = frozenset({b"host", b"content-length", b"transfer-encoding", TIER_HEADER.encode(), COHORT_HEADER.encode()})


@dataclass(slots=True)
class RequestFacts:
    """What the guard reads from a request body: never the prompt itself."""

    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None

    @classmethod
    def parse(cls, request: httpx.Request, body: bytes) -> RequestFacts:
        if not body or "json" not in request.headers.get("content-type", "json"):
            return cls()
        try:
            obj: Any = json.loads(body)
        except ValueError:
            return cls()
        if not isinstance(obj, dict):
            return cls()
        model = obj.get("model")
        max_tokens = obj.get("max_completion_tokens", obj.get("max_tokens", obj.get("max_output_tokens")))
        return cls(
            model=model if isinstance(model, str) else None,
            stream=obj.get("stream") is True,
            max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
        )


@dataclass(slots=True)
class Call:
    """One logical call: the caller's request and everything the layers decide about it."""

    request: httpx.Request
    body: bytes
    headers: list[tuple[bytes, bytes]]
    tier_name: str
    tier: Tier
    guarded: bool
    respond_with_errors: bool
    record: PhaseRecord
    observation: CallObservation
    first_token_deadline: float
    total_deadline: float
    hedgeable: bool
    retry_any_status: bool
    replica_bases: tuple[httpx.URL, ...] = ()
    """Every replica's base URL, to recognise a request already aimed at one of them."""
    budget: RetryBudget | None = None
    """The budget this call's retries and hedges are paid from (its tier's, or the Guard's)."""
    failed_replicas: list[ReplicaState] = field(default_factory=list)

    @staticmethod
    def forwarded_headers(request: httpx.Request) -> list[tuple[bytes, bytes]]:
        """The caller's headers minus the guard's own and those rebuilt per attempt."""
        return [(k, v) for k, v in request.headers.raw if k.lower() not in _STRIPPED]

    def attempt_request(self, state: ReplicaState, attempt: AttemptRecord) -> httpx.Request:
        """The caller's request re-aimed at one replica, with that replica's own headers."""
        url = rebase(self.request.url, state.base, self.replica_bases)
        headers = httpx.Headers(self.headers)
        for key, value in state.replica.headers.items():
            headers[key] = value
        extensions = dict(self.request.extensions)
        request = httpx.Request(self.request.method, url, headers=headers, content=self.body, extensions=extensions)
        plain: dict[str, str] = {}
        self.observation.attempt_started(attempt, str(url), plain)
        for key, value in plain.items():
            request.headers[key] = value
        return request


def rebase(url: httpx.URL, base: httpx.URL, known: tuple[httpx.URL, ...]) -> httpx.URL:
    """``url`` moved onto ``base``: if it starts with a known replica base, that prefix is
    swapped for ``base``'s; otherwise its path is appended to ``base``. Query kept."""
    path = url.raw_path.split(b"?", 1)[0].decode("ascii")
    for candidate in known:
        if url.host == candidate.host and url.port == candidate.port and url.scheme == candidate.scheme:
            prefix = candidate.path.rstrip("/")
            if path == prefix or path.startswith(prefix + "/"):
                path = path[len(prefix) :]
                break
    return base.copy_with(path=base.path.rstrip("/") + path, query=url.query or None)
