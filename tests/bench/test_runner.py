"""The harness against real loopback replicas (tests/loopback.py: Starlette + uvicorn on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import anyio
import pytest

from llmguard_tools.bench.clients import TierSpec, make_client, parse_clients
from llmguard_tools.bench.report import SLO, BenchReport
from llmguard_tools.bench.runner import TargetError, preflight, replay, run_clients, wait_drained
from llmguard_tools.bench.spec import RunSpec
from llmguard_tools.bench.traffic import LengthModel, make_plan, request_body
from tests.clients import plain_httpx
from tests.loopback import LoopbackCluster, Script

SMALL = LengthModel().scaled(0.02)  # prompts ~11 words, outputs ~4 tokens


def _has_guard() -> bool:
    mod = importlib.import_module("llmguard_client")
    return hasattr(mod, "Guard") and hasattr(mod, "Tier")


def _seen(cluster: LoopbackCluster) -> dict[int, tuple[int, int]]:
    """index -> (prompt words, max_tokens) of the bodies the replicas received."""
    out: dict[int, tuple[int, int]] = {}
    for body in cluster.bodies():
        words = body["messages"][-1]["content"].split()
        out[int(words[0][3:])] = (len(words), body["max_tokens"])
    return out


def test_preflight(cluster: LoopbackCluster) -> None:
    model, has_stats = anyio.run(preflight, cluster.urls)
    assert model == "test-model" and has_stats
    with pytest.raises(TargetError, match="cannot reach"):
        anyio.run(preflight, ["http://127.0.0.1:1"])


def test_same_traffic_is_replayed_for_every_client(cluster: LoopbackCluster) -> None:
    plan = make_plan(40, seed=11, rate=200.0, lengths=SMALL)
    expected = {r.index: (r.prompt_words, r.max_tokens) for r in plan.requests}
    seen: dict[str, dict[int, tuple[int, int]]] = {}
    bodies: dict[str, list[dict[str, object]]] = {}

    class Spy:
        def begin(self, client: str, total: int) -> None:
            cluster.reset()  # runs after the harness reset: only this client's bodies are kept

        def advance(self, sample: object) -> None:
            pass

        def end(self, client: str) -> None:
            seen[client] = _seen(cluster)
            bodies[client] = sorted(cluster.bodies(), key=lambda b: str(b["messages"]))

    names = parse_clients("plain,openai-default,naive-retry")
    runs, counters, model = run_clients(names, RunSpec(plan, TierSpec(total=5.0)), urls=cluster.urls, progress=Spy())
    assert counters == "reset" and model == "test-model"
    assert [r.name for r in runs] == names
    for name in names:
        assert seen[name] == expected, name
    assert bodies["plain"] == bodies["naive-retry"]  # byte-for-byte the same requests
    for run in runs:
        assert [s.index for s in run.samples] == list(range(40))
        assert all(s.ok for s in run.samples), [s.cause for s in run.samples if not s.ok]
        for s, r in zip(run.samples, plan.requests, strict=True):
            assert s.completion_tokens == r.max_tokens  # ignore_eos: exactly max_tokens
            assert s.ttft is not None and 0 < s.ttft <= s.e2e
            assert s.attempts == 1
        # counters were reset before the client: the server saw exactly its 40 requests
        assert run.server is not None and run.server.total("received") == 40
        assert run.server.total("completed") == 40


def test_open_loop_follows_the_planned_arrivals(cluster: LoopbackCluster) -> None:
    plan = make_plan(30, seed=1, rate=60.0, lengths=SMALL)
    for server in cluster.servers:  # each answer takes 2 s: a loop waiting for answers would lag by seconds
        server.script = Script(stall_before_first=2.0, tokens=None)

    async def go() -> list[float]:
        client = make_client("plain", cluster.urls, model="test-model", tier=TierSpec())
        await client.start()
        try:
            samples, wall, _ = await replay(client, plan, "test-model")
        finally:
            await client.aclose()
        assert wall >= plan.duration
        return [s.lag for s in samples]

    lags = anyio.run(go)
    # Open loop: every request sent on its planned instant (lags of ms; one busy moment of a shared 2-core machine
    # took 0.26 s), not after earlier answers (a closed loop would lag 2 s and more).
    assert max(lags) < 1.5


def test_closed_loop_caps_concurrency(cluster: LoopbackCluster) -> None:
    plan = make_plan(24, seed=1, concurrency=3, lengths=LengthModel().scaled(0.05))
    runs, _, _ = run_clients(["plain"], RunSpec(plan, TierSpec()), urls=cluster.urls)
    assert all(s.ok for s in runs[0].samples)
    assert 1 < cluster.gauge.max_running <= 3  # streams open at once across the cluster


def test_429s_retry_storm_and_amplification(cluster: LoopbackCluster) -> None:
    # every 4th request is refused on its first attempt (cluster-wide) with Retry-After: 0
    refused = Script(status=429, headers={"retry-after": "0"})
    cluster.set_scripter(lambda index, attempt: refused if index % 4 == 0 and attempt == 1 else None)
    plan = make_plan(40, seed=2, rate=400.0, lengths=SMALL)  # the rate is not under test: 0.1 s per client
    runs, _, _ = run_clients(["plain", "naive-retry", "openai-default"], RunSpec(plan, TierSpec()), urls=cluster.urls)
    report = BenchReport("t", plan, SLO(1.0, 0.1), TierSpec(), "reset", "test-model", runs)
    plain, naive, oa = (report.summary(n) for n in ("plain", "naive-retry", "openai-default"))
    assert plain is not None and naive is not None and oa is not None
    assert plain.ratio_429 == pytest.approx(0.25) and plain.success_ratio == pytest.approx(0.75)
    assert plain.amplification == pytest.approx(1.0)
    assert naive.success_ratio == 1.0 and naive.ratio_429 == 0
    assert naive.amplification == pytest.approx(1.25)  # one extra attempt for each refused request
    assert naive.client_amplification == pytest.approx(1.25)
    assert oa.success_ratio == 1.0 and oa.client_amplification == pytest.approx(1.25)
    assert oa.amplification == pytest.approx(1.25)


def test_deadline_gives_timeouts_and_server_sees_the_disconnect(cluster: LoopbackCluster) -> None:
    stalled = Script(tokens=None, gap=0.002, stall_before_first=3.0)
    cluster.set_scripter(lambda index, attempt: stalled if index < 3 else None)
    plan = make_plan(10, seed=3, rate=100.0, lengths=SMALL)
    runs, _, _ = run_clients(["plain"], RunSpec(plan, TierSpec(ttft=0.3, total=0.6)), urls=cluster.urls)
    statuses = [s.status for s in runs[0].samples]
    assert statuses[:3] == ["timeout"] * 3 and statuses[3:] == ["ok"] * 7
    assert all(s.e2e == pytest.approx(0.6, abs=0.15) for s in runs[0].samples[:3])
    assert runs[0].server is not None and runs[0].server.total("aborted_by_disconnect") == 3


def test_fresh_cluster_per_client(cluster: LoopbackCluster) -> None:
    entered: list[int] = []

    @contextlib.contextmanager
    def spawn() -> Iterator[list[str]]:
        entered.append(1)
        cluster.reset()  # a "new" cluster: zero counters
        yield cluster.urls

    plan = make_plan(10, seed=0, rate=100.0, lengths=SMALL)
    runs, counters, _ = run_clients(
        ["plain", "naive-retry"], RunSpec(plan, TierSpec()), cluster=spawn, fresh_cluster=True
    )
    assert len(entered) == 2 and counters == "fresh"
    assert [r.server.total("received") if r.server else None for r in runs] == [10, 10]
    runs, counters, _ = run_clients(["plain", "naive-retry"], RunSpec(plan, TierSpec()), cluster=spawn)
    assert len(entered) == 3 and counters == "reset"


def test_api_key_is_sent_by_every_client(cluster: LoopbackCluster) -> None:
    names = ["plain", "naive-retry", "openai-default"] + (["guarded"] if _has_guard() else [])
    seen: dict[str, set[str | None]] = {}

    class Spy:
        def begin(self, client: str, total: int) -> None:
            pass

        def advance(self, sample: object) -> None:
            pass

        def end(self, client: str) -> None:
            seen[client] = {a for s in cluster.servers for a in s.auth()}

    plan = make_plan(6, seed=0, rate=100.0, lengths=SMALL)
    runs, _, _ = run_clients(names, RunSpec(plan, TierSpec(), api_key="sk-test"), urls=cluster.urls, progress=Spy())
    assert all(s.ok for r in runs for s in r.samples)
    assert seen == {name: {"Bearer sk-test"} for name in names}


def test_unknown_client() -> None:
    with pytest.raises(ValueError, match="unknown client 'nope'"):
        parse_clients("plain,nope")
    with pytest.raises(ValueError):
        parse_clients(" , ")
    assert parse_clients("plain, guarded,plain") == ["plain", "guarded"]


def test_request_body_is_what_the_server_gets(cluster: LoopbackCluster) -> None:
    plan = make_plan(3, seed=0, rate=100.0, lengths=SMALL)
    run_clients(["plain"], RunSpec(plan, TierSpec()), urls=cluster.urls)
    got = sorted(cluster.bodies(), key=lambda b: b["messages"][0]["content"].split()[0])
    want = sorted(
        (request_body(r, "test-model") for r in plan.requests),
        key=lambda b: b["messages"][0]["content"].split()[0],
    )
    assert got == want


@pytest.mark.skipif(not _has_guard(), reason="llmguard_client.Guard not available yet")
def test_guarded_client_runs(cluster: LoopbackCluster) -> None:
    plan = make_plan(30, seed=4, rate=400.0, lengths=SMALL)  # the rate is not under test
    runs, _, _ = run_clients(
        # Limits no call here should reach: 30 calls at once on a busy machine took over 1 s to a first token.
        ["plain", "guarded"],
        RunSpec(plan, TierSpec(ttft=10.0, total=30.0, stall=10.0)),
        urls=cluster.urls,
    )
    guarded = runs[1]
    assert all(s.ok for s in guarded.samples), [s.cause for s in guarded.samples if not s.ok]
    assert all(s.attempts is not None and s.attempts >= 1 for s in guarded.samples)
    assert [s.completion_tokens for s in guarded.samples] == [r.max_tokens for r in plan.requests]


def test_wait_drained_polls_until_no_stream_runs_or_patience_runs_out(cluster: LoopbackCluster) -> None:
    cluster.servers[0].script = Script(tokens=4, gap=0.1)  # one stream running for about 0.3 s
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async def go() -> None:
        async with plain_httpx() as http, anyio.create_task_group() as tg:
            running = anyio.Event()

            async def stream() -> None:
                async with http.stream("POST", cluster.urls[0] + "/v1/chat/completions", json=body) as response:
                    async for _ in response.aiter_raw():  # the first chunk: the server counts it as running
                        running.set()

            tg.start_soon(stream)
            await running.wait()
            drained, stats = await wait_drained(http, cluster.urls, 0.0)  # no patience: one look, still busy
            assert not drained and [s["running"] for s in stats] == [1, 0]
            started = anyio.current_time()
            drained, stats = await wait_drained(http, cluster.urls, 5.0)
            assert drained and [s["running"] for s in stats] == [0, 0]
            assert anyio.current_time() - started >= 0.1  # it looked again after the stream ended, not at once

    anyio.run(go)
