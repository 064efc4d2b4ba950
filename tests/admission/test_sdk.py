"""A refusal as the openai SDK sees it, over loopback against the simulated cluster: a 429 ``RateLimitError`` at
once, with ``Retry-After`` and the guard's cause, not retried by the SDK."""

from __future__ import annotations

import dataclasses

import anyio
import openai
import pytest

from llmguard_client import Admission, Guard, guard_failure
from llmguard_tools.sim.cluster import SimCluster
from tests.sim.conftest import ENGINE, one_off, wait_until

SLOW = dataclasses.replace(ENGINE, step_s=0.05)
"""50 ms per token: a 100-token answer holds its slot for about 5 s (the test ends it sooner)."""


async def test_the_sdk_gets_a_429_at_once_with_retry_after_and_does_not_retry_it() -> None:
    async with SimCluster(one_off(SLOW)) as cluster:
        url = cluster.urls[0]
        one = Admission(initial_limit=1, max_limit=1, max_waiting=0)
        async with Guard([url], instrumentation=None, admission=one) as guard:
            client = openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="sim", http_client=guard.http_client_for(openai.AsyncOpenAI)
            )
            messages = [{"role": "user", "content": "hi"}]
            async with anyio.create_task_group() as tg:

                async def holder() -> None:
                    await client.chat.completions.create(
                        model="sim-model", messages=messages, max_tokens=100, extra_body={"ignore_eos": True}
                    )

                tg.start_soon(holder)
                await wait_until(lambda: cluster.replicas[0].counters.received == 1)  # the holder's is on the server
                with pytest.raises(openai.RateLimitError) as refused:
                    await client.chat.completions.create(model="sim-model", messages=messages, max_tokens=5)
                # Refused while the holder still has its slot: the refusal waited for nothing.
                assert guard.snapshot().admission[url].in_flight == 1 and not cluster.replicas[0].engine.idle
                tg.cancel_scope.cancel()
            assert guard_failure(refused.value) == "overloaded"
            assert float(refused.value.response.headers["retry-after"]) > 0
            assert refused.value.response.headers["x-should-retry"] == "false"
            assert cluster.replicas[0].counters.received == 1  # never sent, and not retried by the SDK
