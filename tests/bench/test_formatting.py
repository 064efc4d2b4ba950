from __future__ import annotations

from llmguard_tools.bench.formatting import fmt_count, fmt_pct, fmt_ratio, fmt_s, fmt_x


def test_fmt_ratio() -> None:
    assert fmt_ratio(1 / 9) == "1/9"
    assert fmt_ratio(0.26) == "1/4"
    assert fmt_ratio(0.6) == "0.60x"
    assert fmt_ratio(2.5) == "2.50x"
    assert fmt_ratio(0.0) == "0x"


def test_units() -> None:
    assert (fmt_s(0.0512), fmt_s(2.081), fmt_s(None)) == ("51 ms", "2.08 s", "-")
    assert (fmt_pct(0.972), fmt_pct(None)) == ("97.2%", "-")
    assert (fmt_count(44654), fmt_count(1.037, 2), fmt_count(None)) == ("44,654", "1.04", "-")
    assert (fmt_x(0.387), fmt_x(None)) == ("0.39x", "-")
