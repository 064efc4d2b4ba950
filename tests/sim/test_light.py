"""The light replica of the soak and burst benchmarks (llmguard_tools.sim.light), over real loopback sockets."""

from __future__ import annotations

import asyncio
import json

import httpx

from llmguard_tools.sim.light import Replica, parse_args


async def _serve(*options: str) -> tuple[asyncio.Server, str]:
    replica = Replica(parse_args(["--first-token-delay", "0", "--gap", "0", *options]))
    server = await asyncio.start_server(replica.serve_connection, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_stream_is_the_openai_chunks_and_done_and_the_stats_count_it() -> None:
    server, url = await _serve("--tokens", "4")
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            body = {"model": "m", "messages": [], "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                events = [line.removeprefix("data: ") async for line in response.aiter_lines() if line]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            assert text == " t0 t1 t2 t3" and chunks[-1]["choices"][0]["finish_reason"] == "stop"
            plain = (await client.post("/v1/chat/completions", json={"model": "m", "messages": []})).json()
            assert plain["choices"][0]["message"]["content"] == " t" * 4
            stats = (await client.get("/stats")).json()
            assert (stats["requests"], stats["streamed"], stats["plain"]) == (2, 1, 1)
    finally:
        server.close()
        await server.wait_closed()


async def test_at_fault_rate_1_every_request_draws_a_fault_and_the_client_meets_it() -> None:
    server, url = await _serve("--fault-rate", "1", "--seed", "3", "--stall", "0")
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            statuses = []
            for _ in range(20):
                try:
                    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
                    statuses.append(r.status_code)
                except httpx.TransportError:
                    statuses.append(0)  # reset
            stats = (await client.get("/stats")).json()
        faults = {k: v for k, v in stats.items() if k.startswith("fault_")}
        assert sum(faults.values()) == 20 and set(faults) <= {"fault_reset", "fault_http500", "fault_stall"}
        assert statuses.count(500) == faults.get("fault_http500", 0)
        assert statuses.count(0) == faults.get("fault_reset", 0)
    finally:
        server.close()
        await server.wait_closed()
