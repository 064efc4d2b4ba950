"""The ``rollout`` bench client: one traffic stream through one `Guard` at a partial rollout.

It sends every planned request the way an application without the guard would (round-robin
over the replicas, like ``plain``) through ``Guard(rollout=fraction).http_client()``, each
request under its own sticky key (``guard.rollout_key("req-<index>")``), so the guarded share is
the fraction and the same requests are guarded on every run. Control calls are passed through
untouched, so the control cohort *is* the plain client, measured by the guard. With a records
path, each call's phase record is written by `RecordLogger` as one JSON line, ready for
``llmguard compare PATH``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from llmguard_tools.bench.guarded import GuardedClient, guard_api
from llmguard_tools.bench.measure import HTTPStatus, Probe, Sample, TierSpec, consume_sse
from llmguard_tools.bench.traffic import PlannedRequest

DEFAULT_FRACTION = 0.1


class RolloutClient(GuardedClient):
    name = "rollout"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str,
        tier: TierSpec,
        deadline: float | None = None,
        api_key: str | None = None,
        fraction: float | None = None,
        records: str | None = None,
    ):
        super().__init__(urls, model=model, tier=tier, deadline=deadline, api_key=api_key)
        self.fraction = DEFAULT_FRACTION if fraction is None else fraction
        self.records = records
        self._handler: logging.FileHandler | None = None

    async def start(self) -> None:
        from llmguard_client.telemetry.record_logger import RecordLogger

        on_record = None
        if self.records is not None:
            logger = logging.getLogger(f"llmguard_client.record.bench.{id(self)}")
            logger.propagate = False
            logger.setLevel(logging.INFO)
            self._handler = logging.FileHandler(self.records, mode="w", encoding="utf-8")
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(self._handler)
            on_record = RecordLogger(logger)
        guard_cls, tier_cls = guard_api()
        self._guard = guard_cls(
            replicas=list(self.urls),
            tiers={"interactive": tier_cls(ttft=self.tier.ttft, total=self.tier.total, stall=self.tier.stall)},
            default_tier="interactive",
            rollout=self.fraction,
            on_record=on_record,
        )
        self._http: httpx.AsyncClient = self._guard.http_client()
        self._http.headers.update(self.headers)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self._handler is not None:
                self._handler.close()
                logging.getLogger(f"llmguard_client.record.bench.{id(self)}").removeHandler(self._handler)

    async def run(self, req: PlannedRequest, body: dict[str, Any], scheduled_at: float) -> Sample:
        with self._guard.rollout_key(f"req-{req.index}"):
            return await super().run(req, body, scheduled_at)

    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        url = self.next_url() + "/v1/chat/completions"  # where the application itself would send it
        extensions: Mapping[str, Any] = {}
        try:
            async with self._http.stream("POST", url, json=body) as response:
                extensions = response.extensions
                if response.status_code != 200:
                    await response.aread()
                    raise HTTPStatus(response.status_code, response.headers.get("x-llmguard-cause"))
                await consume_sse(response, probe)
        finally:  # read once the response is closed: the call's final record (a snapshot before)
            probe.extra["record"] = extensions.get("llmguard")
