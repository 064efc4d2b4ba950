"""Admission past saturation against a real vLLM engine (no queue limit), clients side by side in one run.

For each offered rate, the same seeded open-loop plan (Poisson arrivals for ``--duration`` s; streamed chat
calls of exactly ``--max-tokens`` tokens, ``ignore_eos``; a fresh prompt for every call, so that no prefix
cache helps) is replayed through each client in turn, each in a process of its own, with the engine idle at
the start of each:

- ``raw``: ``openai.AsyncOpenAI`` on a plain ``httpx2.AsyncClient`` with a big pool (no deadline: it waits);
- ``guard``: the same SDK through ``Guard`` with its defaults and one tier (``--ttft``, total 30 s);
- ``admission``: the same, with ``Guard(admission=Admission())``.

Per client it reports what met the SLO (the whole answer, and its first content token within ``--ttft`` of the
call's planned arrival): SLO-met completions per second of the plan and their share of the calls; the wasted
engine work (``vllm:generation_tokens_total`` over the client's turn, less the tokens the client received, as a
share of the former: tokens generated for calls the client abandoned); refusals (``Overloaded``, a 429 with
``x-llmguard-cause: overloaded`` under the SDK) and their latency p99; the engine's waiting queue at most
(``/metrics`` polled every 0.2 s by this process, not the client's); how far the client's load generator fell
behind its plan (past half the TTFT SLO, at most 1 s, the client's figures are INVALID: the same rule as
``llmguard bench``); the share of a core the client's process used; the load average before and after. Calls
still open ``--drain`` s after the last arrival are abandoned.

Needs a vLLM (0.32) server on loopback, started without ``--max-num-queued-reqs``, e.g.
``/work/shared/tools/vllm/setup.sh serve --no-enable-prefix-caching``:

    python -m benchmarks.vllm_admission --vllm http://127.0.0.1:8011 --rates 40,80,120 [--duration 25]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import openai

from llmguard_client import Admission, Guard, Tier, guard_failure

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ("raw", "guard", "admission")
MODEL = "tiny-llama"
WARM_UP = 3
"""Calls each client makes one after another before its plan starts: not in its figures (their tokens are
received, so not wasted)."""


@dataclasses.dataclass(slots=True)
class CallResult:
    """One call as its client saw it; times in seconds from the run's start."""

    planned: float
    started: float
    status: str = "error"
    """ok, refused (admission's Overloaded), timeout, error, abandoned (still open at the end of the drain)."""
    first_token: float | None = None
    ended: float | None = None
    tokens: int = 0


def plan(rate: float, duration: float, seed: int) -> list[float]:
    """Poisson arrival times in [0, duration)."""
    rng = random.Random(seed)
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def padding(words: int) -> str:
    """``words`` distinct words and a space (none for 0): prefill work for the engine, cheap for the client."""
    return "".join(f"w{i} " for i in range(words))


def make_guard(url: str, ttft: float, admission: bool) -> Guard:
    tiers = {"interactive": Tier(ttft=ttft, total=30.0)}
    return Guard([url], tiers=tiers, instrumentation=None, admission=Admission() if admission else None)


async def one_call(
    oai: openai.AsyncOpenAI, result: CallResult, t0: float, max_tokens: int, tag: str, filler: str = ""
) -> None:
    """Stream one chat call, noting its first content token, the tokens received and how it ended."""
    prompt = f"{tag} {uuid.uuid4().hex} {filler}tell me a story"
    try:
        stream = await oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                result.tokens += 1
                if result.first_token is None:
                    result.first_token = time.perf_counter() - t0
        if usage is not None:
            result.tokens = usage  # vLLM may merge several tokens into one chunk when the reader lags
        result.status = "ok"
    except openai.RateLimitError as exc:
        result.status = "refused" if guard_failure(exc) == "overloaded" else "error"
    except openai.APITimeoutError:
        result.status = "timeout"
    except openai.APIError:
        result.status = "error"
    except anyio.get_cancelled_exc_class():
        result.status = "abandoned"
        raise
    finally:
        result.ended = time.perf_counter() - t0


async def run_client(
    url: str, client: str, arrivals: Sequence[float], args: argparse.Namespace
) -> tuple[int, list[CallResult]]:
    """Replay the plan through one client, after a warm-up (the tokens it received); calls still open
    ``drain`` s after the last arrival are abandoned."""
    guard: Guard | None = None
    if client == "raw":
        http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=10_000), timeout=httpx2.Timeout(120.0))
        oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", http_client=http, max_retries=0)
    else:
        guard = make_guard(url, args.ttft, admission=client == "admission")
        oai = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="sk", http_client=guard.http_client_for(openai.AsyncOpenAI), max_retries=0
        )
    filler = padding(args.prompt_words)  # built once: the load generator's time goes to the plan
    warm_up = [CallResult(0.0, 0.0) for _ in range(WARM_UP)]
    for result in warm_up:  # the SDK builds its models and the pool its connection on first use
        await one_call(oai, result, time.perf_counter(), args.max_tokens, "warm-up", filler)
    results: list[CallResult] = []
    t0 = time.perf_counter()
    with anyio.move_on_after(arrivals[-1] + args.drain if arrivals else 0.0) as scope:
        async with anyio.create_task_group() as tg:
            for planned in arrivals:
                delay = planned - (time.perf_counter() - t0)
                if delay > 0:
                    await anyio.sleep(delay)
                result = CallResult(planned=planned, started=time.perf_counter() - t0)
                results.append(result)
                tg.start_soon(one_call, oai, result, t0, args.max_tokens, client, filler)
    del scope
    await oai.close()
    if guard is not None:
        await guard.aclose()
    return sum(r.tokens for r in warm_up), results


def worker(args: argparse.Namespace) -> None:
    arrivals = plan(args.rate, args.duration, args.seed)
    cpu, wall = time.process_time(), time.perf_counter()
    warm_up, results = anyio.run(run_client, args.vllm.rstrip("/"), args.worker, arrivals, args)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    Path(args.out).write_text(
        json.dumps(
            {"warm_up_tokens": warm_up, "cpu_share": cpu / wall, "calls": [dataclasses.asdict(r) for r in results]}
        )
    )


# --- the orchestrating process: the engine's counters, the clients' processes, the report ---


def engine_metrics(url: str) -> dict[str, float]:
    """The engine's counters and gauges this benchmark reads (summed over label sets)."""
    names = ("vllm:generation_tokens_total", "vllm:num_requests_waiting", "vllm:num_requests_running")
    text = httpx.get(url + "/metrics", timeout=10.0).text
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def wait_idle(url: str, timeout: float = 120.0) -> None:
    """Until the engine holds no request (the previous client's aborted calls are gone)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = engine_metrics(url)
        if m["vllm:num_requests_waiting"] + m["vllm:num_requests_running"] == 0:
            time.sleep(1.0)  # the counters settle after the last request's end
            return
        time.sleep(0.5)
    raise RuntimeError(f"the engine at {url} did not become idle in {timeout:.0f} s")


class QueuePoller(threading.Thread):
    """The engine's waiting queue and running requests at most, polled from this process."""

    def __init__(self, url: str, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.url, self.period = url, period
        self.max_waiting = self.max_running = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5.0) as http:
            while not self._stop_event.wait(self.period):
                try:
                    text = http.get(self.url + "/metrics").text
                except httpx.HTTPError:
                    continue
                for line in text.splitlines():
                    name = line.partition("{")[0]
                    if name == "vllm:num_requests_waiting":
                        self.max_waiting = max(self.max_waiting, float(line.rsplit(" ", 1)[1]))
                    elif name == "vllm:num_requests_running":
                        self.max_running = max(self.max_running, float(line.rsplit(" ", 1)[1]))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def p99(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def summarise(calls: list[dict[str, Any]], args: argparse.Namespace, generated: float) -> dict[str, Any]:
    n = len(calls)
    met = [c for c in calls if c["status"] == "ok" and c["first_token"] - c["planned"] <= args.ttft]
    refused = [c["ended"] - c["started"] for c in calls if c["status"] == "refused"]
    received = sum(c["tokens"] for c in calls)
    statuses: dict[str, int] = {}
    for c in calls:
        statuses[c["status"]] = statuses.get(c["status"], 0) + 1
    behind = max((c["started"] - c["planned"] for c in calls), default=0.0)
    return {
        "calls": n,
        "slo_met_per_s": len(met) / args.duration,
        "slo_met_share": len(met) / n if n else 0.0,
        "generated": generated,
        "received": received,
        "wasted": max(0.0, generated - received) / generated if generated > 0 else 0.0,
        "refused_share": len(refused) / n if n else 0.0,
        "refusal_p99_ms": None if not refused else 1000 * (p99(refused) or 0.0),
        "statuses": statuses,
        "behind_s": behind,
        "invalid": behind > min(1.0, args.ttft / 2),
    }


def run_turn(url: str, client: str, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """One client's turn at one rate, in a process of its own, the engine idle before and after."""
    wait_idle(url)
    load_before = os.getloadavg()[0]
    before = engine_metrics(url)
    poller = QueuePoller(url)
    poller.start()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    command = [sys.executable, "-m", "benchmarks.vllm_admission", "--vllm", url, "--worker", client]
    command += ["--rate", str(rate), "--duration", str(args.duration), "--seed", str(args.seed)]
    command += ["--ttft", str(args.ttft), "--max-tokens", str(args.max_tokens), "--drain", str(args.drain)]
    command += ["--prompt-words", str(args.prompt_words)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tools")]))
    try:
        subprocess.run([*command, "--out", path], cwd=ROOT, env=env, check=True)
        output = json.loads(Path(path).read_text())
    finally:
        Path(path).unlink(missing_ok=True)
    load_after = os.getloadavg()[0]
    wait_idle(url)
    poller.stop()
    after = engine_metrics(url)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    summary = summarise(output["calls"], args, generated - output["warm_up_tokens"])
    summary.update(
        client=client,
        rate=rate,
        engine_waiting_max=poller.max_waiting,
        engine_running_max=poller.max_running,
        load=(load_before, load_after),
        client_cpu=output["cpu_share"],
    )
    return summary


def row(s: dict[str, Any]) -> str:
    refusal = "" if s["refusal_p99_ms"] is None else f"{s['refusal_p99_ms']:.0f} ms"
    mark = " INVALID" if s["invalid"] else ""
    return (
        f"| {s['rate']:g} | {s['client']} | {s['slo_met_per_s']:.1f} | {100 * s['slo_met_share']:.1f} % "
        f"| {100 * s['wasted']:.1f} % | {100 * s['refused_share']:.1f} % | {refusal} "
        f"| {s['engine_waiting_max']:.0f} / {s['engine_running_max']:.0f} | {s['behind_s']:.2f} s{mark} "
        f"| {s['load'][0]:.1f}-{s['load'][1]:.1f} | {100 * s['client_cpu']:.0f} % | {s['statuses']} |"
    )


HEADER = (
    "| rate | client | SLO-met/s | SLO met | wasted | refused | refusal p99 | engine waiting / running max "
    "| behind plan | load | client CPU | outcomes |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(args: argparse.Namespace) -> None:
    url = args.vllm.rstrip("/")
    clients = [c.strip() for c in args.clients.split(",")]
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        raise SystemExit(f"unknown clients {sorted(unknown)}; known: {', '.join(CLIENTS)}")
    summaries: list[dict[str, Any]] = []
    print(HEADER, flush=True)
    for rate in (float(r) for r in args.rates.split(",")):
        for client in clients:
            summaries.append(run_turn(url, client, rate, args))
            print(row(summaries[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", required=True, help="the vLLM server's base URL, e.g. http://127.0.0.1:8011")
    parser.add_argument("--rates", default="40,80", help="offered rates in calls/s, comma-separated")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"some of {', '.join(CLIENTS)}")
    parser.add_argument("--duration", type=float, default=25.0, help="seconds of arrivals per client")
    parser.add_argument("--ttft", type=float, default=1.0, help="the TTFT SLO and the guard tier's ttft, seconds")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--prompt-words", type=int, default=0, help="words added to each prompt: more prefill work per call"
    )
    parser.add_argument("--drain", type=float, default=20.0, help="seconds after the last arrival before abandoning")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write every summary to this file")
    parser.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.worker:
        worker(parsed)
    else:
        main(parsed)
