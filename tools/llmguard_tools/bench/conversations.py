"""Multi-turn traffic (``llmguard bench --sim multiturn``): conversations that resend a growing message list.

Each conversation has its own system prompt (1,000-1,500 words) and 2-6 turns; a turn adds a user message (the
bench's usual prompt mix / 10) and, from the second turn on, the previous turn's answer. Conversations start as
a Poisson process at ``rate / mean turns`` per second, so the turns arrive at about ``rate`` requests/s; a
conversation sends turn n+1 only after turn n ended, plus a think time (exponential, mean ``think_s``). The
planned answer is ``max_tokens`` tokens of the sim's text (the bench sends ``ignore_eos``), so every client
resends the same bytes and a replica's prefix cache sees the same prompts whichever client runs.

A turn's `PlannedRequest.arrival` is the earliest it can be sent (the conversation's start plus the think times
before it); the real send time depends on how fast the earlier turns were answered.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from llmguard_tools.bench.client_base import BenchClient
from llmguard_tools.bench.measure import Replayed, Sample
from llmguard_tools.bench.rates import RateProfile
from llmguard_tools.bench.traffic import _VOCAB, LengthModel, PlannedRequest, TrafficPlan, _profile_arrivals

__all__ = [
    "Conversation",
    "ConversationShape",
    "make_conversation_plan",
    "replay_conversations",
    "turn_body",
    "turn_of",
]


@dataclass(frozen=True)
class ConversationShape:
    """How conversations look: turns per conversation, system prompt words, think time between turns."""

    min_turns: int = 2
    max_turns: int = 6
    system_words: tuple[int, int] = (1_000, 1_500)
    think_s: float = 0.3

    def __post_init__(self) -> None:
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"turns must satisfy 1 <= min_turns <= max_turns, got {self.min_turns}..{self.max_turns}")
        low, high = self.system_words
        if not 0 <= low <= high:
            raise ValueError(f"system_words must be (low, high) with 0 <= low <= high, got {self.system_words}")
        if not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise ValueError(f"think_s must be >= 0 seconds, got {self.think_s!r}")

    @property
    def mean_turns(self) -> float:
        return (self.min_turns + self.max_turns) / 2


@dataclass(frozen=True)
class Conversation:
    """One planned conversation; its turns are ``plan.requests[first : first + turns]``."""

    index: int
    start: float
    first: int
    system_words: int
    user_words: tuple[int, ...]
    answer_tokens: tuple[int, ...]
    think_s: tuple[float, ...]
    """The pause before each turn after the first."""

    @property
    def turns(self) -> int:
        return len(self.user_words)


def make_conversation_plan(
    n: int,
    *,
    seed: int = 0,
    lengths: LengthModel | None = None,
    rate: float | None = None,
    profile: RateProfile | None = None,
    concurrency: int | None = None,
    shape: ConversationShape | None = None,
) -> TrafficPlan:
    """``n`` turns (the last conversation is cut short if needed) with conversations starting at ``rate / mean
    turns`` per second; ``lengths`` sizes the user messages (prompt) and answers (output)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--requests must be a positive integer, got {n!r}")
    if profile is not None or concurrency is not None:
        raise ValueError("multi-turn traffic is open-loop Poisson only: give --rate, not --profile or --concurrency")
    if rate is None or not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--rate must be > 0 requests/s, got {rate!r}")
    shape = shape or ConversationShape()
    lengths = lengths or LengthModel()
    rng = random.Random(seed * 1_000_003 + 41)
    starting = RateProfile(((rate / shape.mean_turns, 1.0),), "conversations")
    starts = _profile_arrivals(random.Random(seed * 1_000_003 + 43), starting, n)
    conversations: list[Conversation] = []
    requests: list[PlannedRequest] = []
    for c, start in enumerate(starts):
        if len(requests) >= n:
            break
        turns = min(rng.randint(shape.min_turns, shape.max_turns), n - len(requests))
        sizes = [lengths.sample(rng) for _ in range(turns)]
        think = tuple(rng.expovariate(1 / shape.think_s) if shape.think_s else 0.0 for _ in range(turns - 1))
        conv = Conversation(
            index=c,
            start=start,
            first=len(requests),
            system_words=rng.randint(*shape.system_words),
            user_words=tuple(p for p, _ in sizes),
            answer_tokens=tuple(o for _, o in sizes),
            think_s=think,
        )
        conversations.append(conv)
        words = conv.system_words
        for k in range(turns):
            words += conv.user_words[k] + (conv.answer_tokens[k - 1] if k else 0)
            arrival = start + sum(think[:k])
            requests.append(PlannedRequest(len(requests), arrival, words, conv.answer_tokens[k]))
    return TrafficPlan(
        requests=tuple(requests),
        mode="conversations",
        seed=seed,
        lengths=lengths,
        rate=rate,
        conversations=tuple(conversations),
    )


def _words(tag: str, n: int, offset: int) -> str:
    words = [tag] if n else []
    words.extend(_VOCAB[(offset + k) % len(_VOCAB)] for k in range(n - 1))
    return " ".join(words)


def turn_body(conv: Conversation, turn: int, model: str) -> dict[str, Any]:
    """The streaming chat body of ``conv``'s turn ``turn`` (0-based): system prompt, the turns so far."""
    messages = [{"role": "system", "content": _words(f"conv{conv.index}", conv.system_words, conv.index * 5)}]
    for k in range(turn + 1):
        if k:
            messages.append({"role": "assistant", "content": " ".join(["tok"] * conv.answer_tokens[k - 1])})
        messages.append({"role": "user", "content": _words(f"c{conv.index}u{k}", conv.user_words[k], k * 3)})
    return {
        "model": model,
        "messages": messages,
        "max_tokens": conv.answer_tokens[turn],
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def turn_of(plan: TrafficPlan) -> list[int]:
    """The turn number (0-based) of every planned request, by index."""
    turns = [0] * len(plan.requests)
    for conv in _conversations(plan):
        for k in range(conv.turns):
            turns[conv.first + k] = k
    return turns


def _conversations(plan: TrafficPlan) -> Sequence[Conversation]:
    return [c for c in plan.conversations if isinstance(c, Conversation)]


async def replay_conversations(
    client: BenchClient, plan: TrafficPlan, model: str, on_sample: Callable[[Sample], None] = lambda s: None
) -> Replayed:
    """Run every conversation of ``plan`` through ``client``, each turn after the previous one ended.

    ``behind`` is how late a turn was sent at most, against its conversation's start (first turns) or the end
    of the previous turn plus the think time (later turns)."""
    samples: list[Sample | None] = [None] * len(plan.requests)
    conversations = _conversations(plan)
    # Built before the first send, as `replay` builds its bodies: a late turn's body is ~10 KB of text, and
    # building it in the run would hold the event loop while other calls wait for their first token.
    bodies = {conv.first + k: turn_body(conv, k, model) for conv in conversations for k in range(conv.turns)}
    start = time.perf_counter() + 0.02
    behind = 0.0

    async def converse(conv: Conversation) -> None:
        nonlocal behind
        for k in range(conv.turns):
            req = plan.requests[conv.first + k]
            at = start + conv.start if k == 0 else time.perf_counter() + conv.think_s[k - 1]
            delay = at - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            behind = max(behind, time.perf_counter() - at)
            sample = await client.run(req, bodies.pop(req.index), at)
            samples[req.index] = sample
            on_sample(sample)

    async with anyio.create_task_group() as tg:
        for conv in conversations:
            delay = start + conv.start - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            tg.start_soon(converse, conv)
    wall = time.perf_counter() - start
    done = [s for s in samples if s is not None]
    assert len(done) == len(plan.requests)
    return Replayed(done, wall, behind)
