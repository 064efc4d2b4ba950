"""Closing a client the Guard handed out ends that client's calls in flight, as closing a plain client does
(docs/usage.md, "Lifecycle"): a stream not read to its end raises a read error at its next read, a call waiting for
its first token raises one at once, their upstream connections are closed and what they held released; the Guard
and other clients' calls go on, and a body read to its end is left as it is."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import pytest

from llmguard_client import Guard, PhaseRecord, Tier
from tests.edges.conftest import aeventually, eventually
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
BODY: Any = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CLOSED = "client this call was made with was closed"
READ_ERRORS = (httpx.ReadError, httpx2.ReadError, openai.APIConnectionError)
"""What a plain client's call raises when its client is closed under it (openai: caused by its client's)."""


def closed_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the read error of a closed client, naming it (an SDK's has it as its cause)."""
    named = exc if not isinstance(exc, openai.APIConnectionError) else exc.__cause__
    return isinstance(exc, READ_ERRORS) and CLOSED in str(named)


def guard_for(servers: list[LoopbackServer], script: Script, records: list[PhaseRecord] | None = None) -> Guard:
    servers[0].script = script
    on_record = records.append if records is not None else None
    tiers = {"t": Tier(ttft=60.0, total=120.0)}
    return Guard([servers[0].url], tiers=tiers, hedge=None, instrumentation=None, on_record=on_record)


class AsyncCaller:
    """One async client of a kind (httpx, httpx2, openai through ``http_client_for``), streaming chat calls."""

    def __init__(self, guard: Guard, kind: str, url: str) -> None:
        self.kind = kind
        if kind == "openai":
            self.sdk = openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client_for(openai.AsyncOpenAI)
            )
        else:
            self.http = guard.http_client() if kind == "httpx" else guard.httpx2_client()
        self.url = url

    async def stream(self) -> tuple[Any, Any]:
        """A stream's iterator, one chunk read, and its phase record's holder."""
        if self.kind == "openai":
            events = await self.sdk.chat.completions.create(model="m", messages=BODY["messages"], stream=True)
            chunks = events.__aiter__()
            await chunks.__anext__()
            return chunks, events.response
        request = self.http.build_request("POST", self.url + "/v1/chat/completions", json=BODY)
        response = await self.http.send(request, stream=True)
        chunks = response.aiter_raw()
        await chunks.__anext__()
        return chunks, response

    async def call(self) -> None:
        if self.kind == "openai":
            await self.sdk.chat.completions.create(model="m", messages=BODY["messages"], stream=True)
        else:
            await self.http.post(self.url + "/v1/chat/completions", json=BODY)

    async def aclose(self) -> None:
        await (self.sdk.close() if self.kind == "openai" else self.http.aclose())


async def read_rest(chunks: Any) -> int:
    return sum([1 async for _ in chunks])


@pytest.mark.parametrize("kind", ["httpx", "httpx2", "openai"])
async def test_closing_an_async_client_ends_its_stream_and_leaves_the_guard_and_other_clients(
    servers: list[LoopbackServer], kind: str
) -> None:
    """Before: the closed client's stream read on to its end, its server generating all of it."""
    guard = guard_for(servers, Script(tokens=200, gap=0.01))
    try:
        closing, other = AsyncCaller(guard, kind, servers[0].url), AsyncCaller(guard, kind, servers[0].url)
        cut, cut_holder = await closing.stream()
        going, going_holder = await other.stream()
        await closing.aclose()
        read_on = 0
        with pytest.raises(READ_ERRORS) as caught:
            async for _ in cut:  # an SDK hands over the events it had decoded already first
                read_on += 1
        assert read_on < 100, read_on
        assert closed_error(caught.value), repr(caught.value)
        assert await aeventually(lambda: servers[0].disconnects == 1)  # the server saw its stream closed
        assert guard.snapshot().calls_in_flight == 1  # the other client's stream only
        record = cut_holder.extensions["llmguard"]
        assert (record.status, record.cause) == ("abandoned", "closed_by_caller")
        assert await read_rest(going) > 0  # the other client's stream reads on to its end
        assert going_holder.extensions["llmguard"].status == "ok"
        await other.aclose()  # read to its end: left as it is
        assert going_holder.extensions["llmguard"].status == "ok" and guard.snapshot().idle
        fresh = AsyncCaller(guard, kind, servers[0].url)  # the Guard goes on
        chunks, _ = await fresh.stream()
        assert await read_rest(chunks) > 0
        await fresh.aclose()
    finally:
        await guard.aclose()


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
async def test_a_body_iterated_again_reads_on_from_where_it_stopped(
    servers: list[LoopbackServer], rollout: float
) -> None:
    """openai drains a body's rest after ``[DONE]`` by iterating it a second time while its first iteration stays
    suspended: the second reads on (every byte once, in order), and nothing the first one left (collected on the
    way) closes the connection under it. Before: the client's body started a second iteration of the core's body
    and dropped the first, whose collection closed the connection (a control call's read failed)."""
    servers[0].script = Script(tokens=5, gap=0.01)
    async with httpx.AsyncClient() as plain:
        whole = (await plain.post(servers[0].url + "/v1/chat/completions", json=BODY)).content
    records: list[PhaseRecord] = []
    guard = guard_for(servers, Script(tokens=5, gap=0.01), records)
    guard.set_rollout(rollout)
    try:
        async with guard.http_client() as client:
            async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=BODY) as response:
                first = response.aiter_raw()
                head = await first.__anext__()
                second = response.stream.__aiter__()
                rest = [await second.__anext__()]
                gc.collect()  # whatever the second iteration left unreferenced is finalized on the loop
                await anyio.sleep(0.05)
                rest += [chunk async for chunk in second]
                del first
        assert head + b"".join(rest) == whole
        (record,) = records
        assert (record.status, record.cause) == ("ok", None)
    finally:
        await guard.aclose()


@pytest.mark.parametrize("kind", ["httpx", "httpx2", "openai"])
async def test_closing_an_async_client_ends_its_call_waiting_for_the_first_token(
    servers: list[LoopbackServer], kind: str
) -> None:
    records: list[PhaseRecord] = []
    guard = guard_for(servers, Script(stall_before_first=30.0), records)
    caught: list[BaseException] = []
    try:
        caller = AsyncCaller(guard, kind, servers[0].url)

        async def call() -> None:
            try:
                await caller.call()
            except Exception as exc:
                caught.append(exc)

        with anyio.fail_after(10):  # not a measure: the call ends with the close, not with its 30 s stall
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                assert await aeventually(lambda: len(servers[0].received) == 1)
                await caller.aclose()
        assert len(caught) == 1 and closed_error(caught[0]), caught
        assert await aeventually(lambda: servers[0].disconnects == 1)
        assert guard.snapshot().idle and len(servers[0].received) == 1  # released; nothing sent again
        assert [(r.status, r.cause) for r in records] == [("cancelled", "cancelled_by_caller")]
    finally:
        await guard.aclose()


class SyncCaller:
    """One sync client of a kind (httpx, httpx2, openai through ``http_client_for``), streaming chat calls."""

    def __init__(self, guard: Guard, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        if kind == "openai":
            self.sdk = openai.OpenAI(
                base_url=url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client_for(openai.OpenAI)
            )
        else:
            self.http: Any = guard.sync_http_client() if kind == "httpx" else guard.sync_httpx2_client()

    def stream(self) -> tuple[Iterator[Any], Any]:
        if self.kind == "openai":
            events = self.sdk.chat.completions.create(model="m", messages=BODY["messages"], stream=True)
            chunks = iter(events)
            next(chunks)
            return chunks, events.response
        response = self.http.send(
            self.http.build_request("POST", self.url + "/v1/chat/completions", json=BODY), stream=True
        )
        chunks = response.iter_raw()
        next(chunks)
        return chunks, response

    def call(self) -> None:
        if self.kind == "openai":
            self.sdk.chat.completions.create(model="m", messages=BODY["messages"], stream=True)
        else:
            self.http.post(self.url + "/v1/chat/completions", json=BODY)

    def close(self) -> None:
        (self.sdk.close if self.kind == "openai" else self.http.close)()


@pytest.mark.parametrize("kind", ["httpx", "httpx2", "openai"])
def test_closing_a_sync_client_ends_its_calls_and_leaves_the_guard_and_other_clients(
    servers: list[LoopbackServer], kind: str
) -> None:
    guard = guard_for(servers, Script(tokens=200, gap=0.01))
    try:
        closing, other = SyncCaller(guard, kind, servers[0].url), SyncCaller(guard, kind, servers[0].url)
        cut, cut_holder = closing.stream()
        going, going_holder = other.stream()
        closing.close()  # returns once the upstream stream is closed
        read_on = 0
        with pytest.raises(READ_ERRORS) as caught:
            for _ in cut:  # an SDK hands over the events it had decoded already first
                read_on += 1
        assert read_on < 100, read_on
        assert closed_error(caught.value), repr(caught.value)
        assert eventually(lambda: servers[0].disconnects == 1)
        assert guard.snapshot().calls_in_flight == 1
        record = cut_holder.extensions["llmguard"]
        assert (record.status, record.cause) == ("abandoned", "closed_by_caller")
        assert sum(1 for _ in going) > 0
        other.close()
        assert going_holder.extensions["llmguard"].status == "ok"

        servers[0].script = Script(stall_before_first=30.0)
        waiting = SyncCaller(guard, kind, servers[0].url)
        failed: list[BaseException] = []

        def call() -> None:
            try:
                waiting.call()
            except Exception as exc:
                failed.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        assert eventually(lambda: len(servers[0].received) == 3)
        waiting.close()  # from another thread than the call's
        thread.join(10)
        assert not thread.is_alive() and len(failed) == 1 and closed_error(failed[0]), failed
        assert eventually(lambda: servers[0].disconnects == 2) and eventually(lambda: guard.snapshot().idle)
        servers[0].script = Script(tokens=3)
        fresh = SyncCaller(guard, kind, servers[0].url)  # the Guard goes on
        chunks, holder = fresh.stream()
        list(chunks)
        assert holder.extensions["llmguard"].status == "ok"
        fresh.close()
    finally:
        guard.close()


def test_a_client_closed_as_its_call_starts_sends_nothing(servers: list[LoopbackServer]) -> None:
    """The sync edges count a call among its client's before it starts: a close that comes first refuses it."""
    guard = guard_for(servers, Script(tokens=3))
    try:
        client = guard.sync_http_client()
        client._transport._calls.close()  # type: ignore[attr-defined]  # closed between httpx's check and the send
        with pytest.raises(httpx.ReadError, match=CLOSED):
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        assert servers[0].received == [] and guard.snapshot().idle
    finally:
        guard.close()
