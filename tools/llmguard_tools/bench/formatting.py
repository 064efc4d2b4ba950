"""How the bench writes numbers: durations, shares, ratios and counts, the same in tables and verdicts."""

from __future__ import annotations

__all__ = ["fmt_count", "fmt_pct", "fmt_ratio", "fmt_s", "fmt_x"]


def fmt_s(v: float | None) -> str:
    """Seconds: ``0.0512 -> '51 ms'``, ``2.081 -> '2.08 s'``, None -> ``'-'``."""
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def fmt_pct(v: float | None) -> str:
    """A share: ``0.972 -> '97.2%'``."""
    return "-" if v is None else f"{v:.1%}"


def fmt_count(v: float | None, digits: int = 0) -> str:
    """A count or mean with thousands separators: ``44654 -> '44,654'``."""
    return "-" if v is None else f"{v:,.{digits}f}"


def fmt_x(v: float | None) -> str:
    """A factor: ``0.387 -> '0.39x'``."""
    return "-" if v is None else f"{v:.2f}x"


def fmt_ratio(r: float) -> str:
    """A factor for prose: ``0.111 -> '1/9'``, ``0.6 -> '0.60x'``, ``2.5 -> '2.50x'``."""
    if r <= 0:
        return "0x"
    if r < 0.5:
        return f"1/{round(1 / r)}"
    return f"{r:.2f}x"
