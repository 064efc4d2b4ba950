"""The engine's vocabulary: configuration checks that name what is wrong, and what a sequence reports."""

from __future__ import annotations

import pytest

from llmguard_tools.sim import engine
from llmguard_tools.sim.engine_types import EngineConfig, EngineStats, Rejected, SeqState, Sequence


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_s": 0}, "step_s and step_time_factor must be positive"),
        ({"tbud": 0}, "tbud, kv_tokens, prefill_chunk and max_running must be >= 1"),
        ({"headroom": 1.5}, r"headroom must be in \(0, 1\]"),
        ({"policy": "fifo"}, "unknown admission policy 'fifo'"),
        ({"kv_tokens": 100, "max_model_len": 200}, "max_model_len cannot exceed kv_tokens"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)  # type: ignore[arg-type]


def test_derived_sizes() -> None:
    cfg = EngineConfig(step_s=0.01, step_time_factor=3.0, kv_tokens=1000)
    assert cfg.step_period == pytest.approx(0.03) and cfg.model_len == 1000
    assert EngineConfig(kv_tokens=1000, max_model_len=800).model_len == 800


def test_sequence_progress_and_errors() -> None:
    seq = Sequence(id=1, prompt_tokens=10, max_tokens=5, output_tokens=5, arrival=0.0, reservation=15,
                   expected_output=5, prefill_target=10, prefilled=4, generated=2)  # fmt: skip
    assert not seq.done and seq.expected_remaining == (10 - 4) + (5 - 2)
    seq.state = SeqState.ABORTED
    assert seq.done
    assert EngineStats(prefill_tokens=7, decode_tokens=3).work_tokens == 10
    assert str(Rejected("token", 0.25)) == "rejected by admission (token); retry after 0.250s"


def test_engine_re_exports_its_types() -> None:
    assert engine.EngineConfig is EngineConfig and engine.Sequence is Sequence
