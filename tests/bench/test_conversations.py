"""Multi-turn traffic: the plan, the growing message lists, and turns sent one after another."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from llmguard_tools.bench import conversations
from llmguard_tools.bench.client_base import BenchClient
from llmguard_tools.bench.conversations import (
    Conversation,
    ConversationShape,
    make_conversation_plan,
    turn_body,
    turn_of,
)
from llmguard_tools.bench.measure import Probe, Sample, TierSpec
from llmguard_tools.bench.presets import PRESETS, SIM_LENGTHS
from llmguard_tools.bench.runner import replay
from llmguard_tools.bench.traffic import PlannedRequest
from llmguard_tools.sim.protocol import parse_request
from llmguard_tools.sim.scenarios import SCENARIOS


def test_the_plan_is_seeded_and_holds_exactly_n_turns_in_conversations_of_2_to_6() -> None:
    plan = make_conversation_plan(200, seed=3, rate=30.0, lengths=SIM_LENGTHS)
    assert plan == make_conversation_plan(200, seed=3, rate=30.0, lengths=SIM_LENGTHS)
    assert plan.fingerprint() != make_conversation_plan(200, seed=4, rate=30.0, lengths=SIM_LENGTHS).fingerprint()
    assert len(plan) == 200 and plan.mode == "conversations"
    assert [r.index for r in plan.requests] == list(range(200))
    convs = plan.conversations
    assert all(2 <= c.turns <= 6 for c in convs[:-1]) and 1 <= convs[-1].turns <= 6
    assert sum(c.turns for c in convs) == 200
    assert all(1_000 <= c.system_words <= 1_500 for c in convs)
    assert [c.start for c in convs] == sorted(c.start for c in convs)
    assert turn_of(plan)[convs[1].first : convs[1].first + 2] == [0, 1]
    assert "conversations, turns at ~30 rps" in plan.describe()


def test_each_turn_resends_the_last_one_plus_its_answer_and_a_new_user_message() -> None:
    plan = make_conversation_plan(40, seed=1, rate=30.0, lengths=SIM_LENGTHS)
    conv = plan.conversations[0]
    bodies = [turn_body(conv, k, "m") for k in range(conv.turns)]
    for k in range(1, conv.turns):
        before, now = bodies[k - 1]["messages"], bodies[k]["messages"]
        assert now[: len(before)] == before
        assert [m["role"] for m in now[len(before) :]] == ["assistant", "user"]
        assert len(now[len(before)]["content"].split()) == conv.answer_tokens[k - 1]
    for k, body in enumerate(bodies):
        request = plan.requests[conv.first + k]
        parsed = parse_request(json.dumps(body).encode(), "chat", "m", block_tokens=16)
        assert parsed.prompt_tokens == request.prompt_words  # the sim counts what the plan says
        assert body["max_tokens"] == request.max_tokens == conv.answer_tokens[k]
        if k:  # the previous turn's prompt blocks are a prefix of this one's: a replica can reuse them
            previous = parse_request(json.dumps(bodies[k - 1]).encode(), "chat", "m", block_tokens=16)
            assert parsed.block_hashes[: len(previous.block_hashes)] == previous.block_hashes
    other = parse_request(json.dumps(turn_body(plan.conversations[1], 0, "m")).encode(), "chat", "m", block_tokens=16)
    first = parse_request(json.dumps(bodies[0]).encode(), "chat", "m", block_tokens=16)
    assert other.block_hashes[0] != first.block_hashes[0]  # every conversation has its own system prompt


def test_the_multiturn_scenario_fits_its_prompts() -> None:
    plan = make_conversation_plan(400, seed=0, rate=30.0, lengths=SIM_LENGTHS)
    hint = SCENARIOS["multiturn"].load.prompt_words
    assert max(r.prompt_words for r in plan.requests) <= hint.cap
    assert SCENARIOS["multiturn"].engine.prefix_cache_tokens > 0 and PRESETS["multiturn"].conversations
    assert all(s.engine.prefix_cache_tokens == 0 for name, s in SCENARIOS.items() if name != "multiturn")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"rate": 10.0, "concurrency": 4}, "open-loop Poisson only"), ({"rate": None}, "--rate must be > 0")],
)
def test_bad_plans_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_conversation_plan(10, **kwargs)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="min_turns <= max_turns"):
        ConversationShape(min_turns=3, max_turns=2)
    with pytest.raises(ValueError, match="think_s must be >= 0"):
        ConversationShape(think_s=-1.0)
    with pytest.raises(ValueError, match="system_words must be"):
        ConversationShape(system_words=(10, 5))


class _Recorder(BenchClient):
    """Answers every turn after a short pause and records when each ran and what it sent."""

    name = "recorder"

    def __init__(self) -> None:
        super().__init__(["http://unused"], model="m", tier=TierSpec(total=5.0))
        self.spans: dict[int, tuple[float, float]] = {}
        self.bodies: dict[int, dict[str, Any]] = {}

    async def aclose(self) -> None:
        pass

    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        raise AssertionError("run is overridden")

    async def run(self, req: PlannedRequest, body: dict[str, Any], scheduled_at: float) -> Sample:
        start = anyio.current_time()
        await anyio.sleep(0.01 * (1 + req.index % 3))
        self.spans[req.index] = (start, anyio.current_time())
        self.bodies[req.index] = body
        return Sample(req.index, self.name, "ok", 200, None, req.arrival, 0.0, 0.005, 0.01, req.max_tokens, None, 1)


def test_replay_sends_each_turn_only_after_the_previous_one_ended() -> None:
    plan = make_conversation_plan(30, seed=2, rate=200.0, lengths=SIM_LENGTHS, shape=ConversationShape(think_s=0.0))
    client = _Recorder()
    samples, wall, behind = anyio.run(replay, client, plan, "m")  # the runner hands conversation plans over
    assert wall > 0 and behind >= 0
    assert [s.index for s in samples] == list(range(30))
    for conv in plan.conversations:
        for k in range(1, conv.turns):
            assert client.spans[conv.first + k][0] >= client.spans[conv.first + k - 1][1]
            assert len(client.bodies[conv.first + k]["messages"]) == 2 * k + 2
    overlapping = [
        (a, b)
        for a in plan.conversations
        for b in plan.conversations
        if a.index < b.index and client.spans[b.first][0] < client.spans[a.first + a.turns - 1][1]
    ]
    assert overlapping  # conversations run side by side, not one after another


def test_replay_builds_every_turns_body_before_the_first_send(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_conversation_plan(12, seed=1, rate=200.0, lengths=SIM_LENGTHS, shape=ConversationShape(think_s=0.0))
    built: list[float] = []

    def counting(conv: Conversation, turn: int, model: str) -> dict[str, Any]:
        built.append(anyio.current_time())
        return turn_body(conv, turn, model)

    monkeypatch.setattr(conversations, "turn_body", counting)
    client = _Recorder()
    anyio.run(replay, client, plan, "m")
    first_send = min(start for start, _ in client.spans.values())
    assert len(built) == 12 and max(built) <= first_send  # none on the way while calls wait for a token
    last = plan.conversations[-1]
    assert isinstance(last, Conversation)
    assert client.bodies[last.first + last.turns - 1] == turn_body(last, last.turns - 1, "m")
