"""A guarded client's ``auth=`` runs for each request the guard sends: a retry (on the same replica or another), a
hedge, each gets its own signature over its own replica's Host; a challenge (a 401 answered by a refreshed token)
is met within its attempt. In virtual time on both backends for the async client, against loopback servers for
the sync ones (whose flow runs off the Guard's event loop)."""

from __future__ import annotations

import hashlib
import hmac
import threading
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from llmguard_client import Guard, HedgePolicy, PhaseRecord, Replica
from tests.edges.conftest import BODY
from tests.loopback import LoopbackServer, Script
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
STREAM = {**BODY, "stream": True}
A, B = "http://a.test", "http://b.test"


def signature(host: str, nonce: str, body: bytes) -> str:
    return hmac.new(b"k", host.encode() + nonce.encode() + body, hashlib.sha256).hexdigest()


class NonceAuth(httpx.Auth):
    """Signs each request with a fresh nonce, over its Host and body, as replay-protected gateways require."""

    requires_request_body = True

    def __init__(self) -> None:
        self.threads: list[str] = []

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self.threads.append(threading.current_thread().name)
        nonce = uuid.uuid4().hex
        request.headers["x-nonce"] = nonce
        request.headers["x-sig"] = signature(request.headers["host"], nonce, request.content)
        yield request


class TokenAuth(httpx.Auth):
    """Sends its token; on a 401, refreshes it and sends the request again (a challenge met within the flow)."""

    def __init__(self) -> None:
        self.token = "stale"
        self.refreshes = 0

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["authorization"] = f"Bearer {self.token}"
        response = yield request
        if response.status_code == 401:
            self.refreshes += 1
            self.token = f"fresh{self.refreshes}"
            request.headers["authorization"] = f"Bearer {self.token}"
            yield request


@dataclass
class Seen:
    """What a gateway in front of the replicas has seen: each nonce once, signed for the replica it reached."""

    plans: list[Plan]
    nonces: list[str] = field(default_factory=list)
    admitted: int = 0

    def refusal(self, request: httpx.Request, body: bytes) -> str | None:
        nonce = request.headers.get("x-nonce")
        if nonce is None:
            token = request.headers.get("authorization", "")
            return None if token.startswith("Bearer fresh") else "stale token"
        replayed = nonce in self.nonces
        self.nonces.append(nonce)
        if replayed:
            return "replayed nonce"
        if request.headers.get("x-sig") != signature(request.url.netloc.decode(), nonce, body):
            return "signed for another host"
        return None


@dataclass
class Gateway(FakeReplica):
    """A replica behind the gateway: a 401 for a refused request; the others answered with the gateway's plans in
    turn, across its replicas."""

    seen: Seen = field(default_factory=lambda: Seen([Plan()]))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        refused = self.seen.refusal(request, await request.aread())
        if refused is not None:
            return httpx.Response(401, json={"error": {"message": refused}})
        self.plans, self.requests = self.seen.plans, self.seen.admitted
        self.seen.admitted += 1
        return await super().handle_async_request(request)


def gateway(plans: list[Plan], *urls: str) -> tuple[Seen, dict[str, FakeReplica]]:
    seen = Seen(plans)
    return seen, {url: Gateway(url, seen=seen) for url in urls}


def call(fakes: dict[str, FakeReplica], auth: httpx.Auth, **kwargs: Any) -> tuple[int, list[PhaseRecord]]:
    """The status of one streamed call through a guarded client given ``auth``, and the calls' records."""
    records: list[PhaseRecord] = []
    status: list[int] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, **kwargs) as guard, guard.http_client(auth=auth) as client:
            response = await client.post(A + CHAT, json=STREAM)
            await response.aread()
            status.append(response.status_code)

    run_virtual(main, kwargs.pop("backend"))
    return status[0], records


@BACKENDS
def test_a_retry_on_the_same_replica_is_signed_afresh(backend: str) -> None:
    seen, fakes = gateway([Plan(status=503), Plan()], A)
    status, records = call(fakes, NonceAuth(), backend=backend, hedge=None)
    assert status == 200 and len(seen.nonces) == len(set(seen.nonces)) == 2
    assert [(a.replica, a.outcome) for a in records[0].attempts] == [(A, "failed"), (A, "won")]


@BACKENDS
def test_a_retry_on_another_replica_is_signed_for_that_replica(backend: str) -> None:
    seen, fakes = gateway([Plan(status=503), Plan()], A, B)
    status, records = call(fakes, NonceAuth(), backend=backend, hedge=None)
    first, retry = records[0].attempts
    assert status == 200 and first.replica != retry.replica and retry.outcome == "won"
    assert len(seen.nonces) == len(set(seen.nonces)) == 2


@BACKENDS
def test_a_hedge_gets_its_own_signature(backend: str) -> None:
    seen, fakes = gateway([Plan(first_token_after=3.0), Plan()], A, B)
    status, records = call(fakes, NonceAuth(), backend=backend, hedge=HedgePolicy(delay=0.2))
    kinds = [(a.kind, a.outcome) for a in records[0].attempts]
    assert status == 200 and kinds == [("primary", "lost"), ("hedge", "won")]
    assert len(seen.nonces) == len(set(seen.nonces)) == 2


@BACKENDS
def test_a_challenge_is_met_within_its_attempt_and_refreshes_once(backend: str) -> None:
    """Stale token: 401, refreshed, sent again in the same attempt (503); the retry sends the fresh token, no
    refresh."""
    auth = TokenAuth()
    _, fakes = gateway([Plan(status=503), Plan()], A)
    status, records = call(fakes, auth, backend=backend, hedge=None)
    assert status == 200 and auth.refreshes == 1
    assert [a.outcome for a in records[0].attempts] == ["failed", "won"]


@BACKENDS
def test_a_call_of_the_control_cohort_is_signed_once(backend: str) -> None:
    seen, fakes = gateway([Plan()], A)
    status, records = call(fakes, NonceAuth(), backend=backend, rollout=0.0)
    assert status == 200 and records[0].cohort == "control" and len(seen.nonces) == 1


def retried_once(server: LoopbackServer) -> None:
    server.scripter = lambda index, attempt: Script(status=503) if attempt == 1 else None


def assert_signed_afresh(server: LoopbackServer) -> None:
    received = [r for r in server.received if r.path == CHAT]
    nonces = [r.headers["x-nonce"] for r in received]
    assert len(received) == 2 and len(set(nonces)) == 2
    for r in received:  # the server saw the JSON the client sent: signed over those very bytes
        assert r.headers["x-sig"] == signature(r.headers["host"], r.headers["x-nonce"], httpx_body(BODY_REQ0))


BODY_REQ0 = {**BODY, "messages": [{"role": "user", "content": "req0 hi"}]}


def httpx_body(json: Any) -> bytes:
    return httpx.Request("POST", "http://x", json=json).content


def test_a_sync_clients_flow_is_run_for_each_attempt_off_the_guards_loop(servers: list[LoopbackServer]) -> None:
    retried_once(servers[0])
    auth = NonceAuth()
    with Guard([servers[0].url], instrumentation=None, hedge=None) as guard, guard.sync_http_client(auth=auth) as c:
        assert c.post(servers[0].url + CHAT, json=BODY_REQ0).status_code == 200
    assert_signed_afresh(servers[0])
    assert len(auth.threads) == 2 and not any(name.startswith("llmguard-sync-") for name in auth.threads)


def test_a_sync_httpx2_clients_flow_is_run_for_each_attempt(servers: list[LoopbackServer]) -> None:
    httpx2 = pytest.importorskip("httpx2")

    class Nonce2(httpx2.Auth):  # type: ignore[misc, name-defined]
        requires_request_body = True

        def auth_flow(self, request: Any) -> Generator[Any, Any, None]:
            nonce = uuid.uuid4().hex
            request.headers["x-nonce"] = nonce
            request.headers["x-sig"] = signature(request.headers["host"], nonce, request.content)
            yield request

    retried_once(servers[0])
    with Guard([servers[0].url], instrumentation=None, hedge=None) as guard:
        with guard.sync_httpx2_client(auth=Nonce2()) as client:
            assert client.post(servers[0].url + CHAT, json=BODY_REQ0).status_code == 200
    assert_signed_afresh(servers[0])


async def test_basic_auth_and_an_auth_for_one_request(servers: list[LoopbackServer]) -> None:
    """A tuple is httpx's BasicAuth, sent with each attempt; an ``auth=`` given for one request replaces the client's
    (as in httpx) and runs once, above the guard."""
    async with Guard([servers[0].url], instrumentation=None) as guard, guard.http_client(auth=("u", "p")) as client:
        await client.post(servers[0].url + CHAT, json=BODY)
        await client.post(servers[0].url + CHAT, json=BODY, auth=httpx.BasicAuth("v", "q"))
    assert servers[0].auth() == ["Basic dTpw", "Basic djpx"]


async def test_a_replicas_own_credential_still_wins(servers: list[LoopbackServer]) -> None:
    """A `Replica`'s own headers replace the caller's of the same name, the ones its auth set too."""
    replica = Replica(servers[0].url, headers={"Authorization": "Bearer replica"})
    async with Guard([replica], instrumentation=None) as guard, guard.http_client(auth=("u", "p")) as client:
        await client.post(servers[0].url + CHAT, json=BODY)
    assert servers[0].auth() == ["Bearer replica"]


async def test_an_async_httpx2_clients_flow_is_run_for_each_attempt(servers: list[LoopbackServer]) -> None:
    httpx2 = pytest.importorskip("httpx2")

    def sign(request: Any) -> Any:  # a function auth: httpx2 builds its FunctionAuth
        nonce = uuid.uuid4().hex
        request.headers["x-nonce"] = nonce
        request.headers["x-sig"] = signature(request.headers["host"], nonce, request.content)
        return request

    retried_once(servers[0])
    async with Guard([servers[0].url], instrumentation=None, hedge=None) as guard:
        async with guard.httpx2_client(auth=sign) as client:
            assert isinstance(client, httpx2.AsyncClient)
            assert (await client.post(servers[0].url + CHAT, json=BODY_REQ0)).status_code == 200
    assert_signed_afresh(servers[0])
