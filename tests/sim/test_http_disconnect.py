"""A client that goes away stops the work at once and gives back everything it held."""

from __future__ import annotations

import contextlib
import dataclasses

import httpx

from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.faults import FaultConfig
from llmguard_tools.sim.replica import Replica
from tests.clients import plain_httpx, plain_sdk
from tests.sim.conftest import ENGINE, chat_body, one_off, wait_until


def drained(replica: Replica) -> bool:
    engine = replica.engine
    return engine.running == 0 and engine.waiting == 0 and engine.kv_used == 0 and engine.reserved == 0


async def test_closing_mid_stream_stops_generation_within_two_steps() -> None:
    # 50 ms steps: "two steps" leaves 100 ms for the disconnect to travel through a loaded event loop.
    engine = dataclasses.replace(ENGINE, step_s=0.05)
    async with SimCluster(one_off(engine)) as cluster, plain_httpx() as http:
        replica = cluster.replicas[0]
        url = cluster.urls[0] + "/v1/chat/completions"
        async with http.stream("POST", url, json=chat_body(words=20, max_tokens=500)) as response:
            tokens = 0
            async for line in response.aiter_lines():
                tokens += '" tok"' in line
                if tokens == 3:
                    break
            assert replica.engine.reserved > 0 and replica.engine.kv_used > 0
            decoded_at_close = replica.engine.stats.decode_tokens
        await wait_until(lambda: replica.engine.stats.aborted_by_disconnect == 1, within=5.0)
        assert replica.engine.stats.decode_tokens - decoded_at_close <= 2
        assert drained(replica)
        decoded = replica.engine.stats.decode_tokens
        stats = (await http.get(cluster.urls[0] + "/sim/stats")).json()
    assert stats["aborted_by_disconnect"] == 1 and stats["completed"] == 0
    assert stats["aborted_work_tokens"] == 20 + decoded
    assert stats["kv_used"] == stats["reserved"] == stats["running"] == 0


async def test_openai_stream_close_releases_the_reservation() -> None:
    async with SimCluster(one_off()) as cluster:
        replica = cluster.replicas[0]
        async with plain_sdk(cluster.urls[0], max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "a b c"}],
                max_tokens=1000,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    break
            await stream.close()
            await wait_until(lambda: replica.engine.stats.aborted_by_disconnect == 1)
        assert drained(replica)


async def test_giving_up_on_a_non_stream_request_aborts_it() -> None:
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        replica = cluster.replicas[0]
        body = chat_body(max_tokens=1000, stream=False)
        with contextlib.suppress(httpx.ReadTimeout):
            await http.post(cluster.urls[0] + "/v1/chat/completions", json=body, timeout=0.2)
        await wait_until(lambda: replica.engine.stats.aborted_by_disconnect == 1)
        assert drained(replica) and replica.engine.stats.decode_tokens < 1000


async def test_disconnect_while_stalled_before_the_first_token_releases_the_slot() -> None:
    async with SimCluster(one_off(faults=(FaultConfig(stall_first_p=1.0, stall_first_s=30.0),))) as cluster:
        replica = cluster.replicas[0]
        async with plain_httpx() as http:
            url = cluster.urls[0] + "/v1/chat/completions"
            async with http.stream("POST", url, json=chat_body(max_tokens=10)) as response:
                assert response.status_code == 200
                await wait_until(lambda: replica.engine.running == 1)
                assert replica.engine.reserved > 0
        await wait_until(lambda: replica.engine.stats.aborted_by_disconnect == 1)
        assert drained(replica) and replica.engine.stats.decode_tokens == 0
