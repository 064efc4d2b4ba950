"""What cache-aware routing can gain in the ``multiturn`` simulation, in virtual time: no client, no HTTP, no CPU.

    python -m benchmarks.affinity_ceiling [--requests 300] [--rate 10] [--seeds 3]

The bench's own conversations (`make_conversation_plan`, the ``multiturn`` preset's lengths) are sent to three
engines of the ``multiturn`` scenario (`Engine`, with its prefix cache), each stepped every ``step_s`` of virtual
time while it has work; a conversation sends its next turn when the last one ended plus its think time, as the
bench does. Each policy routes every turn at once, on its arrival:

- ``round-robin``: the replicas in turn;
- ``least-loaded``: the fewest requests in flight (ties in turn), about what the guard without affinity does;
- ``rendezvous``: the key's rendezvous order over replica URLs that change every run, within the in-flight
  bound (`affinity.choose`, ``load_factor`` 1.25, ``load_slack`` 2): the guard's affinity before homes;
- ``affinity``: the guard's rule now: the key's home (the replica that answered its last turn), a new key placed
  among the replicas with the fewest in flight (the router's tie for its least cost) by the recent calls
  (`affinity.place`, 30 s half-life), then the in-flight bound.

It prints, per policy and seed, TTFT p50 / p99 of all turns and p50 of first and of later turns (server-side:
arrival to first token), the prefix cache's token hit rate, the busiest replica's calls over the mean, and how
many prompt tokens the later turns had to prefill (p50 and max). These
are the ceilings the simulator allows; the bench adds the client, the HTTP hops and the machine's CPU to every
figure.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
from collections.abc import Callable

from llmguard_client._routing.affinity.hashing import affinity_order, auto_key, choose, place
from llmguard_client._routing.health import RECENT_HALF_LIFE
from llmguard_client._routing.quantile import percentile
from llmguard_tools.bench.conversations import Conversation, make_conversation_plan, turn_body
from llmguard_tools.bench.presets import PRESETS
from llmguard_tools.sim.engine import Engine, EngineRequest, Sequence
from llmguard_tools.sim.protocol import parse_request
from llmguard_tools.sim.scenarios import get_scenario

POLICIES = ("round-robin", "least-loaded", "rendezvous", "affinity")


class Router:
    """One policy's state: requests in flight, recent calls and homes per replica."""

    def __init__(self, policy: str, names: list[str]) -> None:
        self.policy, self.names = policy, names
        self.in_flight = dict.fromkeys(names, 0)
        self.recent, self.recent_at = dict.fromkeys(names, 0.0), 0.0
        self.homes: dict[str, str] = {}
        self.turn = itertools.count()

    def pick(self, key: str, now: float) -> str:
        fade = math.pow(0.5, (now - self.recent_at) / RECENT_HALF_LIFE)
        self.recent, self.recent_at = {n: r * fade for n, r in self.recent.items()}, now
        if self.policy == "round-robin":
            name = self.names[next(self.turn) % len(self.names)]
        elif self.policy == "least-loaded":
            least = min(self.in_flight.values())
            ties = [n for n in self.names if self.in_flight[n] == least]
            name = ties[next(self.turn) % len(ties)]
        else:
            order, slack = affinity_order(key, self.names), 2
            home = self.homes.get(key) if self.policy == "affinity" else None
            if self.policy == "affinity" and home is None:
                least = min(self.in_flight[n] for n in order)  # the router's tie for its least cost
                order = [n for n in order if self.in_flight[n] == least]
                home, slack = place(order, self.recent, 1.25, 2), 0
            order.sort(key=lambda n: n != home)
            name = choose(order, self.in_flight, (), 1.25, slack) or order[0]
            self.homes[key] = name
        self.recent[name] += 1.0
        return name


def run(policy: str, requests: int, rate: float, seed: int) -> dict[str, float]:
    """One policy over one seed's conversations; the replicas' URLs are drawn from ``seed`` too."""
    cfg = get_scenario("multiturn").engine
    plan = make_conversation_plan(requests, seed=seed, lengths=PRESETS["multiturn"].lengths, rate=rate)
    rng = random.Random(seed)
    names = [f"http://127.0.0.1:{rng.randint(20_000, 60_000)}" for _ in range(3)]
    engines = {n: Engine(cfg, random.Random(i)) for i, n in enumerate(names)}
    router = Router(policy, names)
    events: list[tuple[float, int, Callable[[float], None]]] = []
    order = itertools.count()
    live: dict[str, list[tuple[Sequence, Conversation, int]]] = {n: [] for n in names}
    stepping: set[str] = set()
    ttfts: list[tuple[int, float]] = []
    uncached: list[int] = []
    """Prompt tokens a later turn had to prefill (not found cached)."""
    calls = dict.fromkeys(names, 0)

    def at(t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(events, (t, next(order), action))

    def send(conv: Conversation, k: int) -> Callable[[float], None]:
        def go(now: float) -> None:
            raw = json.dumps(turn_body(conv, k, "m")).encode()
            req = parse_request(raw, "chat", "m", block_tokens=cfg.cache_block_tokens)
            name = router.pick(auto_key(raw) or "", now)
            tokens = conv.answer_tokens[k]  # the bench sends max_tokens with ignore_eos
            engine_req = EngineRequest(req.prompt_tokens, tokens, tokens, req.block_hashes)
            live[name].append((engines[name].submit(engine_req, now), conv, k))
            router.in_flight[name] += 1
            calls[name] += 1
            if name not in stepping:
                stepping.add(name)
                at(now, step(name))

        return go

    def step(name: str) -> Callable[[float], None]:
        def go(now: float) -> None:
            engines[name].step(now)
            for item in [item for item in live[name] if item[0].done]:
                live[name].remove(item)
                seq, conv, k = item
                router.in_flight[name] -= 1
                assert seq.first_token_at is not None
                ttfts.append((k, seq.first_token_at - seq.arrival))
                if k:
                    uncached.append(seq.prompt_tokens - seq.cached)
                if k + 1 < conv.turns:
                    at(now + conv.think_s[k], send(conv, k + 1))
            if engines[name].idle:
                stepping.discard(name)
            else:
                at(now + cfg.step_period, go)

        return go

    for conv in plan.conversations:
        assert isinstance(conv, Conversation)
        at(conv.start, send(conv, 0))
    while events:
        t, _, action = heapq.heappop(events)
        action(t)
    every = [t for _, t in ttfts]
    hits = sum(e.prefix_cache.counters.hits for e in engines.values())
    queries = sum(e.prefix_cache.counters.queries for e in engines.values())
    return {
        "p50": percentile(every, 50) or 0.0,
        "p99": percentile(every, 99) or 0.0,
        "first": percentile([t for k, t in ttfts if k == 0], 50) or 0.0,
        "later": percentile([t for k, t in ttfts if k > 0], 50) or 0.0,
        "hit": hits / queries,
        "busiest": max(calls.values()) / (sum(calls.values()) / len(calls)),
        "uncached": percentile(uncached, 50) or 0.0,
        "uncached_max": max(uncached, default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    header = "policy        seed  TTFT p50    p99  first  later  hit rate  busiest"
    print(header + "  later turns' uncached tokens p50 / max")
    for policy in POLICIES:
        for seed in range(args.seeds):
            r = run(policy, args.requests, args.rate, seed)
            ms = {k: f"{1000 * r[k]:.0f} ms" for k in ("p50", "p99", "first", "later")}
            print(
                f"{policy:<13} {seed:>4}  {ms['p50']:>8} {ms['p99']:>6} {ms['first']:>6} {ms['later']:>6}"
                f"  {100 * r['hit']:>7.0f}%  {r['busiest']:>6.2f}x  {r['uncached']:.0f} / {r['uncached_max']:.0f}"
            )


if __name__ == "__main__":
    main()
