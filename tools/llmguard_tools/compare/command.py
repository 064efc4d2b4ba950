"""``llmguard compare RECORDS.jsonl``: the guarded cohort against control, and whether to widen."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import IO, Any

from llmguard_tools.compare.load import Records, read_path
from llmguard_tools.compare.render import Report, render_text
from llmguard_tools.compare.strata import Stratum, choose, strata
from llmguard_tools.compare.summary import METRICS, differences, goodput, summarize
from llmguard_tools.compare.verdict import Thresholds, decide


class InputError(Exception):
    """Bad input to ``compare``: reported as one line, exit status 2."""


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


def _rollout_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``compare`` on the CLI's subparsers."""
    c: argparse.ArgumentParser = sub.add_parser(
        "compare",
        help="a rollout's guarded vs control cohorts: widen, hold, roll back",
        description="Per cohort and tier: calls, success, timeouts, 429s, TTFT p50/p95/p99, e2e p99, attempts "
        "and server load per call; guarded - control with bootstrap CIs; a verdict: widen, hold or roll back "
        "(docs/rollout.md). Only the calls of one rollout fraction are compared, never those of the guard off "
        "(fraction 0).",
    )
    c.add_argument("records", metavar="RECORDS", help="JSON lines of phase records (RecordLogger), or '-' for stdin")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON instead of text")
    c.add_argument("--tier", action="append", metavar="NAME", help="only these tiers (repeatable)")
    c.add_argument(
        "--fraction",
        type=_rollout_fraction,
        metavar="F",
        help="compare the calls of rollout fraction F (default: the newest fraction above 0 with calls in both "
        "cohorts)",
    )
    c.add_argument(
        "--ttft-slo",
        type=float,
        metavar="S",
        help="also show goodput: success with TTFT <= S seconds, e.g. your tier's ttft (not used by the verdict)",
    )
    boot = c.add_argument_group("bootstrap")
    boot.add_argument("--resamples", type=int, default=2000, metavar="B", help="default: %(default)s")
    boot.add_argument("--confidence", type=_fraction, default=0.95, metavar="C", help="default: %(default)s")
    boot.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    rules = c.add_argument_group("verdict thresholds")
    rules.add_argument(
        "--max-attempts",
        type=float,
        default=1.2,
        metavar="A",
        help="roll back if guarded attempts per call exceed A (default: %(default)s)",
    )
    rules.add_argument(
        "--success-drop",
        type=float,
        default=0.0,
        metavar="D",
        help="roll back if guarded success is significantly lower by more than D, a fraction (default: %(default)s)",
    )
    rules.add_argument(
        "--min-calls",
        type=int,
        default=30,
        metavar="N",
        help="hold until each cohort has N calls (default: %(default)s)",
    )
    return c


def no_records(source: str, records: Records) -> str:
    """What to check when ``source`` held no phase record."""
    name = "stdin" if source == "-" else source
    if records.lines == 0:
        found = "it is empty"
    else:
        found = f"read {records.lines} lines, skipped {records.skipped} that were not records"
        if records.objects:
            found += f" ({records.objects} JSON objects without cohort, tier and status)"
    return (
        f"no phase records in {name}: {found}. Check that the records were written: RecordLogger() logs "
        "each record through the logging module at INFO (logger 'llmguard_client.record'), so nothing is "
        "written unless logging is configured to keep INFO records, e.g. logging.basicConfig(level=logging.INFO, "
        "filename='records.jsonl'); or give it a path: RecordLogger(\"records.jsonl\"). The file must hold "
        "JSON lines, one record per line (a logging prefix before the '{' is fine)."
    )


def run(args: argparse.Namespace, out: IO[str] | None = None, stdin: IO[str] | None = None) -> int:
    out = out if out is not None else sys.stdout
    if args.resamples < 100:
        raise InputError(f"--resamples must be at least 100, got {args.resamples}")
    if args.ttft_slo is not None and not (math.isfinite(args.ttft_slo) and args.ttft_slo > 0):
        raise InputError(f"--ttft-slo must be seconds > 0 (e.g. 1.0), got {args.ttft_slo}")
    if not math.isfinite(args.max_attempts):
        raise InputError(f"--max-attempts must be a number >= 1.0, got {args.max_attempts}")
    try:
        thresholds = Thresholds(args.max_attempts, args.success_drop, args.min_calls)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    try:
        records = read_path(args.records, stdin)
    except OSError as exc:
        raise InputError(f"cannot read {args.records}: {exc.strerror or exc}") from None
    calls = records.calls
    if args.tier:
        known = sorted({c.tier for c in calls})
        unknown = sorted(set(args.tier) - set(known))
        if unknown:
            raise InputError(f"--tier {', '.join(unknown)}: not in the records (tiers: {', '.join(known) or 'none'})")
        calls = [c for c in calls if c.tier in args.tier]
    if not calls:
        raise InputError(no_records(args.records, records))
    found = strata(calls)
    chosen = _chosen(found, args.fraction, "stdin" if args.records == "-" else args.records)
    compared = chosen.calls
    metrics = [*METRICS, goodput(args.ttft_slo)] if args.ttft_slo is not None else list(METRICS)
    groups = summarize(compared, metrics)
    diffs = differences(compared, metrics, resamples=args.resamples, confidence=args.confidence, seed=args.seed)
    report = Report(
        source="stdin" if args.records == "-" else args.records,
        records=len(calls),
        skipped=records.skipped,
        compared=chosen,
        not_compared=[s for s in found if s is not chosen],
        groups=groups,
        diffs=diffs,
        verdict=decide(groups, diffs, thresholds),
        thresholds=thresholds,
        resamples=args.resamples,
        confidence=args.confidence,
        seed=args.seed,
    )
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        out.write(render_text(report))
    return 0


def _chosen(found: list[Stratum], fraction: float | None, source: str) -> Stratum:
    """The calls to compare (`choose`), or an InputError saying why there are none."""
    chosen = choose(found, fraction)
    if chosen is not None:
        return chosen
    seen = ", ".join(f"{s.name()} with {len(s.calls)} calls" for s in found)
    if fraction is not None:
        raise InputError(f"--fraction {fraction:g}: no calls of that rollout fraction (fractions: {seen})")
    raise InputError(
        f"nothing to compare in {source}: every call was made with the guard off (rollout fraction 0, the kill "
        f"switch: control only; {seen})"
    )
