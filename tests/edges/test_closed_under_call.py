"""What an SDK's caller gets when the Guard closes under its call (docs/usage.md, "Lifecycle"): a call still
waiting for its first token, and a stream being read, for openai and anthropic in either failure mode."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from llmguard_client import Guard, GuardClosed, Tier, guard_failure
from tests.edges.conftest import aeventually
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
MESSAGES: Any = [{"role": "user", "content": "hi"}]

EXPECTED = {  # (sdk, failure mode, phase) -> the exception's class name, and its status (None: no answer)
    ("openai", "auto", "waiting"): ("InternalServerError", 503),
    ("anthropic", "auto", "waiting"): ("ServiceUnavailableError", 503),
    ("openai", "raise", "waiting"): ("APIConnectionError", None),
    ("anthropic", "raise", "waiting"): ("APIConnectionError", None),
    **{
        (sdk, mode, "reading"): ("APIConnectionError", None)
        for sdk in ("openai", "anthropic")
        for mode in ("auto", "raise")
    },
}


@pytest.mark.parametrize(("sdk", "mode", "phase"), list(EXPECTED))
async def test_a_call_the_guard_closes_under_ends_as_the_docs_say(
    servers: list[LoopbackServer], sdk: str, mode: str, phase: str
) -> None:
    servers[0].script = Script(stall_before_first=30.0) if phase == "waiting" else Script(tokens=1000, gap=0.05)
    kwargs: dict[str, Any] = {} if mode == "auto" else {"failure_mode": "raise"}
    guard = Guard(
        [servers[0].url], tiers={"t": Tier(ttft=60.0, total=120.0)}, hedge=None, instrumentation=None, **kwargs
    )
    read_one = anyio.Event()
    caught: list[Exception] = []

    async def call() -> None:
        try:
            if sdk == "openai":
                client = openai.AsyncOpenAI(
                    base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
                )
                events: Any = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            else:
                client = anthropic.AsyncAnthropic(
                    base_url=servers[0].url, api_key="k", http_client=guard.http_client_for(anthropic.AsyncAnthropic)
                )
                events = await client.messages.create(model="m", max_tokens=2000, messages=MESSAGES, stream=True)
            async for _ in events:
                read_one.set()
        except Exception as exc:
            caught.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        if phase == "waiting":
            assert await aeventually(lambda: len(servers[0].received) == 1)
        else:
            await read_one.wait()
        await guard.aclose()
    name, status = EXPECTED[sdk, mode, phase]
    (error,) = caught
    assert (type(error).__name__, getattr(error, "status_code", None)) == (name, status)
    assert type(error).__module__.split(".")[0] == sdk
    assert guard_failure(error) == "guard_closed"
    if status is None:
        assert isinstance(error.__cause__, GuardClosed)
    assert len(servers[0].received) == 1  # no retry reached a server
