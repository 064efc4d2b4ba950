"""Requests the client signed (AWS SigV4, as `anthropic.AnthropicBedrock` sends them) through a Guard: every signed
header arrives as it was signed, and the request at the host it was signed for, so the server's check passes; its
retries go there too, with the request unchanged."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmguard_client import Guard, PhaseRecord, Replica, Tier
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, running

KEY, SECRET, REGION, SERVICE = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", "us-east-1", "bedrock"
DATE = "20261207T000000Z"
PATH = "/model/m/messages"
"""Ends in ``/messages``: a generation path, hedged and retried on any status."""
BODY = b'{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
TIERS = {"default": Tier(ttft=10, total=20), "batch": Tier(ttft=10, total=30)}


# --- AWS Signature Version 4, stdlib only -------------------------------------------------------------------------


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signature(method: str, path: str, headers: dict[str, str], signed: list[str], body: bytes) -> str:
    """The SigV4 signature of a request (``headers`` by lower-case name, ``signed`` sorted)."""
    canonical_headers = "".join(f"{name}:{headers[name].strip()}\n" for name in signed)
    payload = hashlib.sha256(body).hexdigest()
    canonical = "\n".join([method, path, "", canonical_headers, ";".join(signed), payload])
    scope = f"{DATE[:8]}/{REGION}/{SERVICE}/aws4_request"
    text = "\n".join(["AWS4-HMAC-SHA256", DATE, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{SECRET}".encode(), DATE[:8]), REGION), SERVICE), "aws4_request")
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(request: httpx.Request) -> httpx.Request:
    """``request`` signed as botocore signs an SDK's request: every header it carries (Host included)."""
    request.headers["x-amz-date"] = DATE
    headers = {k.decode().lower(): v.decode() for k, v in request.headers.raw}
    signed = sorted(name for name in headers if name not in ("authorization", "user-agent"))
    value = signature(request.method, request.url.raw_path.decode(), headers, signed, request.content)
    request.headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={KEY}/{DATE[:8]}/{REGION}/{SERVICE}/aws4_request, "
        f"SignedHeaders={';'.join(signed)}, Signature={value}"
    )
    return request


# --- a loopback Bedrock that checks the signature -----------------------------------------------------------------


@dataclass
class Seen:
    host: str
    ok: bool
    headers: dict[str, str]


@dataclass
class SigningServer:
    """Answers ``POST PATH`` with a Messages answer when its SigV4 signature verifies, else 403 (as Bedrock's
    ``InvalidSignatureException``); ``fail_first`` requests get a 503 first."""

    name: str
    fail_first: int = 0
    seen: list[Seen] = field(default_factory=list)
    server: LoopbackServer = field(init=False)

    def __post_init__(self) -> None:
        self.server = LoopbackServer(self.name, routes=[Route(PATH, self._handle, methods=["POST"])])

    @property
    def url(self) -> str:
        return self.server.url

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        headers = {k.decode(): v.decode() for k, v in request.scope["headers"]}
        auth = headers.get("authorization", "")
        signed = auth.partition("SignedHeaders=")[2].partition(",")[0].split(";")
        missing = [name for name in signed if name not in headers]
        ok = not missing and auth.endswith(
            "Signature=" + signature("POST", request.scope["raw_path"].decode(), headers, signed, body)
        )
        self.seen.append(Seen(headers.get("host", ""), ok, headers))
        if not ok:
            return JSONResponse({"message": "The request signature we calculated does not match"}, status_code=403)
        if self.fail_first:
            self.fail_first -= 1
            return JSONResponse({"message": "busy"}, status_code=503)
        answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn"}
        return JSONResponse({**answer, "content": [{"type": "text", "text": "hello"}]})


@pytest.fixture
def bedrock() -> Iterator[tuple[SigningServer, SigningServer]]:
    a, b = SigningServer("east"), SigningServer("west")
    with running([a.server, b.server]):
        yield a, b


class RefusedFirst(httpx.AsyncBaseTransport):
    """A replica's pool whose first connection is refused."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.refuse = inner, 1

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.refuse:
            self.refuse -= 1
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def send(guard: Guard, sync: bool, url: str, headers: dict[str, str]) -> httpx.Response:
    """One signed request through the guard's async or sync httpx client, read whole."""
    headers = {"content-type": "application/json", "x-stainless-retry-count": "0", **headers}
    if sync:
        with guard.sync_http_client() as client:
            return client.send(sign(client.build_request("POST", url + PATH, content=BODY, headers=headers)))
    async with guard.http_client() as client:
        return await client.send(sign(client.build_request("POST", url + PATH, content=BODY, headers=headers)))


CLIENTS = pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])


def guard_over(urls: list[str], records: list[PhaseRecord], factory: Callable[[Replica], Any] = pools) -> Guard:
    return Guard(urls, tiers=TIERS, instrumentation=None, transport_factory=factory, on_record=records.append)


@CLIENTS
@pytest.mark.parametrize("header", [("x-llmguard-tier", "batch"), ("x-llmguard-max-attempts", "2")])
async def test_a_signed_header_of_the_guards_is_read_and_forwarded_as_signed(
    bedrock: tuple[SigningServer, SigningServer], sync: bool, header: tuple[str, str]
) -> None:
    east, _ = bedrock
    records: list[PhaseRecord] = []
    async with guard_over([east.url], records) as guard:
        response = await send(guard, sync, east.url, dict([header]))
    assert response.status_code == 200, response.text
    assert [s.ok for s in east.seen] == [True]
    assert east.seen[0].headers[header[0]] == header[1]
    assert records[-1].tier == ("batch" if header[0] == "x-llmguard-tier" else "default")


@CLIENTS
async def test_a_signed_retry_count_is_not_rewritten_on_the_guards_retry(
    bedrock: tuple[SigningServer, SigningServer], sync: bool
) -> None:
    east, _ = bedrock
    records: list[PhaseRecord] = []
    async with guard_over([east.url], records, lambda r: RefusedFirst(pools(r))) as guard:
        response = await send(guard, sync, east.url, {})
    assert response.status_code == 200, response.text
    assert [(s.ok, s.headers["x-stainless-retry-count"]) for s in east.seen] == [(True, "0")]
    assert len(records[-1].attempts) == 2  # the refused connection, then the guard's retry


@CLIENTS
async def test_a_request_signed_for_one_replica_goes_only_there_retries_included(
    bedrock: tuple[SigningServer, SigningServer], sync: bool
) -> None:
    east, west = bedrock
    west.fail_first = 1  # the first call's retry goes back to the replica it was signed for, not to the other
    records: list[PhaseRecord] = []
    async with guard_over([east.url, west.url], records) as guard:
        statuses = [(await send(guard, sync, west.url, {})).status_code for _ in range(4)]
    assert statuses == [200] * 4
    assert east.seen == []
    assert [s.ok for s in west.seen] == [True] * 5
    assert {s.host for s in west.seen} == {west.url.removeprefix("http://")}
    assert [a.replica for a in records[0].attempts] == [west.url] * 2


@CLIENTS
async def test_a_request_signed_for_an_origin_no_replica_has_is_sent_there_once(
    bedrock: tuple[SigningServer, SigningServer], sync: bool, caplog: pytest.LogCaptureFixture
) -> None:
    east, west = bedrock
    records: list[PhaseRecord] = []
    with caplog.at_level(logging.WARNING, "llmguard_client"):
        async with guard_over([east.url], records) as guard:
            response = await send(guard, sync, west.url, {"x-llmguard-tier": "batch"})
    assert response.status_code == 200, response.text
    assert east.seen == [] and [s.ok for s in west.seen] == [True]
    assert records[-1].one_attempt == "signed_other_origin" and records[-1].tier == "batch"
    assert "no replica's origin" in caplog.text


@CLIENTS
async def test_an_unsigned_request_still_loses_the_guards_headers_and_counts_its_retries(
    bedrock: tuple[SigningServer, SigningServer], sync: bool
) -> None:
    east, _ = bedrock
    records: list[PhaseRecord] = []
    headers = {"x-llmguard-tier": "batch", "x-stainless-retry-count": "0", "content-type": "application/json"}
    async with guard_over([east.url], records, lambda r: RefusedFirst(pools(r))) as guard:
        if sync:
            with guard.sync_http_client() as client:
                client.post(east.url + PATH, content=BODY, headers=headers)
        else:
            async with guard.http_client() as client:
                await client.post(east.url + PATH, content=BODY, headers=headers)
    assert "x-llmguard-tier" not in east.seen[0].headers
    assert east.seen[0].headers["x-stainless-retry-count"] == "1"


@CLIENTS
async def test_a_replicas_own_header_does_not_replace_a_signed_one(
    bedrock: tuple[SigningServer, SigningServer], sync: bool
) -> None:
    east, _ = bedrock
    replica = Replica(east.url, headers={"x-api-key": "the replica's"})
    async with Guard([replica], tiers=TIERS, instrumentation=None, transport_factory=pools) as guard:
        response = await send(guard, sync, east.url, {"x-api-key": "the caller's"})
    assert response.status_code == 200, response.text
    assert east.seen[0].headers["x-api-key"] == "the caller's"
