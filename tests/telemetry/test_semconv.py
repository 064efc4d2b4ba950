"""`semconv.gen_ai_latest`: the opt-in to the latest GenAI metric names, as OpenTelemetry parses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmguard_client.telemetry import semconv as sc

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("", False),
        ("http", False),
        ("gen_ai_latest_experimental", True),
        ("http,gen_ai_latest_experimental", True),
        (" database , gen_ai_latest_experimental ", True),
        ("gen_ai_latest_experimental_v2", False),
        ("gen_ai", False),
    ],
)
def test_gen_ai_latest_parses_the_comma_separated_list(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {OPT_IN: value}
    assert sc.gen_ai_latest(environ) is expected


def test_every_llmguard_attribute_is_in_the_observability_tables() -> None:
    """Each ``llmguard.*`` span attribute and metric label is documented in docs/observability.md (``llmguard.chaos``,
    on attempt spans, was not)."""
    doc = (Path(__file__).parents[2] / "docs" / "observability.md").read_text(encoding="utf-8")
    names = [v for k, v in vars(sc).items() if k.startswith("LLMGUARD_") and isinstance(v, str) and "." in v]
    assert sc.LLMGUARD_CHAOS in names
    assert [name for name in names if f"`{name}`" not in doc] == []
