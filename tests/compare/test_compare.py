"""``llmguard compare``: reading RecordLogger lines, finding a known difference, the verdict, the CLI."""

from __future__ import annotations

import io
import json
import logging
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmguard_client.telemetry.record import AttemptRecord, PhaseRecord
from llmguard_client.telemetry.record_logger import RecordLogger
from llmguard_tools import cli
from llmguard_tools.compare.load import Call, read_records
from llmguard_tools.compare.summary import ALL_TIERS, METRICS, differences, goodput, summarize
from llmguard_tools.compare.verdict import Thresholds, decide


def call(cohort: str, ttft: float | None = 0.1, status: str = "ok", tier: str = "interactive", **kw: Any) -> Call:
    return Call(
        cohort=cohort,
        tier=tier,
        status=status,
        http_status=kw.pop("http_status", 200 if status == "ok" else None),
        ttft=ttft,
        e2e=kw.pop("e2e", None if ttft is None else ttft + 0.5),
        attempts=kw.pop("attempts", 1),
        sent=kw.pop("sent", kw.get("attempts", 1)),
        fraction=kw.pop("fraction", 0.1),
    )


def cohorts(n_guarded: int, n_control: int, seed: int, guarded: dict[str, Any], control: dict[str, Any]) -> list[Call]:
    """Synthetic calls: TTFT uniform on [base, base + 1) s, failing with the given probability."""
    rng = random.Random(seed)
    out = []
    for cohort, n, spec in (("guarded", n_guarded, guarded), ("control", n_control, control)):
        for _ in range(n):
            failed = rng.random() < spec.get("fail", 0.0)
            ttft = None if failed else spec.get("base", 0.0) + rng.random()
            attempts = 2 if rng.random() < spec.get("extra", 0.0) else 1
            out.append(call(cohort, ttft, "timeout" if failed else "ok", attempts=attempts))
    return out


def find(diffs: list[Any], metric: str, scope: str = "interactive") -> Any:
    return next(d for d in diffs if d.metric == metric and d.scope == scope)


def test_a_known_difference_is_found_and_covered() -> None:
    # control: 10 % timeouts and TTFT 0.5 s later; guarded: 1 % timeouts. True differences: +9 pp, p99 -0.5 s.
    calls = cohorts(1200, 3000, 1, {"fail": 0.01, "extra": 0.05}, {"fail": 0.10, "base": 0.5})
    diffs = differences(calls, seed=0)
    success, p99 = find(diffs, "success"), find(diffs, "ttft_p99")
    assert success.interval.low > 0 and success.interval.low < 0.09 < success.interval.high
    assert p99.interval.high < 0 and p99.interval.low < -0.5 < p99.interval.high
    verdict = decide(summarize(calls), diffs, Thresholds())
    assert verdict.decision == "widen"
    assert any("TTFT p99" in r for r in verdict.reasons) and any("success rate" in r for r in verdict.reasons)


def test_identical_cohorts_say_hold_and_every_interval_covers_zero() -> None:
    same = cohorts(0, 800, 2, {}, {"fail": 0.05, "extra": 0.1})
    calls = same + [call("guarded", c.ttft, c.status, attempts=c.attempts) for c in same]
    diffs = differences(calls, seed=0)
    assert len(diffs) == 9
    for d in diffs:
        assert d.interval is not None and d.interval.low <= 0.0 <= d.interval.high, d
        assert d.interval.estimate == pytest.approx(0.0, abs=1e-12)
    verdict = decide(summarize(calls), diffs, Thresholds())
    assert verdict.decision == "hold" and verdict.reasons[0].startswith("no significant gain yet")


def test_same_distribution_intervals_cover_zero_about_as_often_as_promised() -> None:
    covered = {"success": 0, "ttft_p99": 0}
    runs = 30
    for seed in range(runs):
        calls = cohorts(200, 200, 100 + seed, {"fail": 0.05}, {"fail": 0.05})
        diffs = differences(calls, resamples=300, seed=seed)
        for name in covered:
            d = find(diffs, name)
            covered[name] += d.interval.low <= 0.0 <= d.interval.high
    print(f"95% intervals covering 0 over {runs} same-distribution pairs: {covered}")
    assert all(count >= 0.85 * runs for count in covered.values()), covered


def heavy_tailed(n_guarded: int, n_control: int, seed: int, **control: float) -> list[Call]:
    """TTFT 10 ms x Pareto(1.5): few calls make the tail. ``control`` can add a straggler share (``late``
    of the calls ``delay`` s later)."""
    rng = random.Random(seed)
    out = []
    for cohort, n in (("guarded", n_guarded), ("control", n_control)):
        for _ in range(n):
            ttft = 0.01 * rng.paretovariate(1.5)
            if cohort == "control" and rng.random() < control.get("late", 0.0):
                ttft += control.get("delay", 0.0)
            out.append(call(cohort, ttft))
    return out


def test_an_aa_p99_from_50_calls_a_cohort_is_no_gain() -> None:
    """One distribution in both cohorts, 50 calls each: the bootstrap of a p99 this deep in the tail is that
    of a maximum, narrow and lopsided (here it excludes 0), so it must not be read as a gain."""
    calls = heavy_tailed(50, 50, 4)
    diffs = differences(calls, seed=0)
    verdict = decide(summarize(calls), diffs, Thresholds())
    assert verdict.decision == "hold", verdict.line()
    assert "not a gain until each cohort has 1000 calls for it: guarded 50, control 50" in verdict.reasons[0]
    p99 = find(diffs, "ttft_p99")
    assert p99.interval.high < 0 and p99.needs == 1000 and p99.significant is None  # invalid, not "lower"


def test_aa_runs_never_widen_on_a_short_p99() -> None:
    widened = []
    for seed in range(100):
        calls = heavy_tailed(50, 50, seed)
        if decide(summarize(calls), differences(calls, resamples=500, seed=seed), Thresholds()).decision == "widen":
            widened.append(seed)
    assert widened == []  # the promise: a false alarm costs a hold, never a widen


def test_a_p99_gain_counts_with_1000_calls_a_cohort_and_not_with_fewer() -> None:
    # control: 5 % of its calls 2 s late (stragglers the guard hedges away)
    calls = heavy_tailed(1000, 1000, 7, late=0.05, delay=2.0)
    verdict = decide(summarize(calls), differences(calls), Thresholds())
    assert verdict.decision == "widen" and verdict.reasons[0].startswith("TTFT p99 -"), verdict.line()
    fewer = calls[1:]  # 999 guarded
    verdict = decide(summarize(fewer), differences(fewer), Thresholds())
    assert verdict.decision == "hold", verdict.line()
    assert "not a gain until each cohort has 1000 calls for it: guarded 999, control 1000" in verdict.reasons[0]
    p99 = find(differences(fewer), "ttft_p99")
    assert p99.interval.high < 0 and p99.needs == 1000 and p99.significant is None


def test_a_short_p99_still_counts_as_a_regression() -> None:
    calls = heavy_tailed(50, 50, 7) + [call("guarded", 3.0)] * 5  # 5 of 55 guarded calls 3 s: a worse tail
    diffs = differences(calls, seed=0)
    assert find(diffs, "ttft_p99").significant == "higher"
    verdict = decide(summarize(calls), diffs, Thresholds())
    assert verdict.decision == "hold" and verdict.reasons[0].startswith("significant regression: ")
    assert "TTFT p99 +" in verdict.reasons[0]


def test_significantly_lower_success_rolls_back() -> None:
    calls = cohorts(600, 3000, 3, {"fail": 0.08}, {"fail": 0.01})
    verdict = decide(summarize(calls), differences(calls), Thresholds())
    assert verdict.decision == "roll back" and "guarded success lower" in verdict.reasons[0]
    # a tolerated drop larger than the observed one turns it into a hold (still a regression)
    verdict = decide(summarize(calls), differences(calls), Thresholds(success_drop=0.2))
    assert verdict.decision == "hold" and "significant regression" in verdict.reasons[0]


def test_too_many_attempts_per_call_rolls_back_even_when_faster() -> None:
    calls = cohorts(1200, 3000, 4, {"extra": 0.3}, {"base": 0.5})
    verdict = decide(summarize(calls), differences(calls), Thresholds())
    mean = sum(c.attempts for c in calls if c.cohort == "guarded") / 1200
    assert mean > 1.2 and verdict.decision == "roll back"
    assert verdict.reasons == [f"guarded attempts/call {mean:.3f} > 1.2"]
    assert decide(summarize(calls), differences(calls), Thresholds(max_attempts=1.5)).decision == "widen"


def test_a_slower_tail_holds() -> None:
    calls = cohorts(600, 3000, 5, {"base": 0.3}, {})
    verdict = decide(summarize(calls), differences(calls), Thresholds())
    assert verdict.decision == "hold" and "TTFT p99" in verdict.reasons[0] and "regression" in verdict.reasons[0]


def test_too_few_calls_hold_whatever_they_say() -> None:
    calls = cohorts(10, 3000, 6, {"fail": 0.5}, {})
    verdict = decide(summarize(calls), differences(calls), Thresholds())
    assert verdict.decision == "hold" and verdict.reasons == [
        "not enough calls: guarded 10, control 3000 (need 30 in each)"
    ]


def test_tiers_are_compared_apart_and_together() -> None:
    calls = [call("guarded", 0.1, tier="batch"), call("control", 0.2, tier="batch")] * 20
    calls += [call("guarded", 0.1), call("control", 0.1)] * 20
    groups = summarize(calls)
    assert [(g.tier, g.cohort, g.calls) for g in groups] == [
        ("batch", "guarded", 20),
        ("batch", "control", 20),
        ("interactive", "guarded", 20),
        ("interactive", "control", 20),
        (ALL_TIERS, "guarded", 40),
        (ALL_TIERS, "control", 40),
    ]
    assert {d.scope for d in differences(calls, resamples=200)} == {"batch", "interactive", ALL_TIERS}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"max_attempts": 0.9}, ">= 1.0"), ({"success_drop": 1.0}, "[0, 1)"), ({"min_calls": 1}, ">= 2")],
)
def test_thresholds_are_checked(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        Thresholds(**kwargs)


# --- reading records ----------------------------------------------------------------------------------------


def logged_records(path: Path, records: list[PhaseRecord]) -> None:
    """Write records the way a user would: RecordLogger through a logging handler with a prefix."""
    logger = logging.getLogger(f"test.compare.{path.name}")
    logger.propagate = False
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    writer = RecordLogger(logger)
    try:
        for record in records:
            writer(record)
    finally:
        handler.close()
        logger.removeHandler(handler)


def phase_record(i: int, cohort: str) -> PhaseRecord:
    record = PhaseRecord(
        request_id=f"r{i}",
        tier="interactive",
        cohort=cohort,  # type: ignore[arg-type]
        method="POST",
        path="/v1/chat/completions",
        start=10.0,
        start_unix=1.7e9,
        rollout_fraction=0.1,
        first_token=10.2,
        finish=10.7,
        status="ok",
        http_status=200,
        attempts=(
            AttemptRecord(index=0, replica="http://r", kind="primary", start=10.0, sent=10.001, status_code=200),
        ),
    )
    if cohort == "guarded" and i % 10 == 1:  # a hedge that never reached a server (connect error)
        hedge = AttemptRecord(index=1, replica="http://r2", kind="hedge", start=10.2)
        record = replace(record, attempts=(*record.attempts, hedge))
    return record


def test_recordlogger_lines_behind_a_logging_prefix_are_read(tmp_path: Path) -> None:
    path = tmp_path / "records.log"
    logged_records(path, [phase_record(i, "guarded" if i % 2 else "control") for i in range(40)])
    with path.open("a") as f:
        f.write("a line that is not a record\n\n{not json\n[1, 2]\n")
    records = read_records(path.read_text().splitlines())
    assert len(records.calls) == 40 and records.skipped == 3
    first = records.calls[1]
    assert (first.cohort, first.tier, first.status, first.fraction) == ("guarded", "interactive", "ok", 0.1)
    assert first.ttft == pytest.approx(0.2) and first.e2e == pytest.approx(0.7)
    hedged = [c for c in records.calls if c.attempts == 2]
    assert hedged and all(c.sent == 1 for c in hedged)


def test_ttft_and_e2e_are_derived_when_only_timestamps_are_there() -> None:
    line = json.dumps({"cohort": "control", "tier": "t", "status": "ok", "start": 1.0, "first_token": 1.5, "finish": 3})
    (only,) = read_records([line]).calls
    assert (only.ttft, only.e2e, only.attempts, only.fraction) == (0.5, 2.0, 0, None)


def test_an_sdks_retries_are_folded_into_the_call_they_retry() -> None:
    """A control call's SDK retries are a record each (the guard did not send them): read as one call, with the
    last request's outcome, the time from the first request's start, and every request's attempts."""

    def line(cohort: str, start: float, status: str, code: int, sdk: tuple[str | None, int], ttft: float | None) -> str:
        finish = start + (0.05 if ttft is None else ttft + 0.3)
        first = None if ttft is None else start + ttft
        record = {"cohort": cohort, "tier": "t", "status": status, "http_status": code, "start": start}
        record |= {"first_token": first, "finish": finish, "sdk_call": sdk[0], "sdk_retry": sdk[1]}
        return json.dumps({**record, "attempts": [{"sent": start}]})

    lines = [
        line("control", 1.0, "http_error", 429, ("a", 0), None),
        line("guarded", 1.2, "ok", 200, ("b", 0), 0.1),  # another call between
        line("guarded", 1.5, "ok", 200, ("a", 1), 0.2),  # a's retry, drawn into the other cohort
        line("control", 3.0, "ok", 200, ("a", 0), 0.1),  # the same body sent again later: a call of its own
        line("control", 4.0, "ok", 200, (None, 0), 0.1),  # no SDK: never folded
    ]
    calls = read_records(lines).calls
    assert [(c.cohort, c.status, c.http_status, c.attempts) for c in calls] == [
        ("control", "ok", 200, 2),
        ("guarded", "ok", 200, 1),
        ("control", "ok", 200, 1),
        ("control", "ok", 200, 1),
    ]
    assert calls[0].ttft == pytest.approx(0.7) and calls[0].e2e == pytest.approx(1.0)  # from the first request


# --- the CLI ------------------------------------------------------------------------------------------------


def write_calls(path: Path, n_guarded: int = 1000, n_control: int = 1800) -> None:
    rng = random.Random(9)
    with path.open("w") as f:
        for i in range(n_guarded + n_control):
            cohort = "guarded" if i < n_guarded else "control"
            ttft = rng.random() * 0.1 + (2.0 if cohort == "control" and rng.random() < 0.05 else 0.0)
            attempts = [{"sent": 1.0}] * (2 if cohort == "guarded" and rng.random() < 0.05 else 1)
            obj = {
                "cohort": cohort,
                "tier": "interactive",
                "status": "ok",
                "http_status": 200,
                "ttft": ttft,
                "duration": ttft + 0.3,
                "attempts": attempts,
                "rollout_fraction": 0.1,
            }
            f.write(json.dumps(obj) + "\n")


def test_cli_text_report_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.jsonl"
    write_calls(path)
    assert cli.main(["compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2800 records (0 other lines skipped); rollout fraction compared: 0.1" in " ".join(out.split())
    assert "interactive  guarded   1000" in out and "interactive  control   1800" in out
    assert out.split("\n\n")[-1].startswith("verdict: WIDEN - TTFT p99 -")  # the last paragraph


def test_cli_json_is_reproducible_and_reads_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.jsonl"
    write_calls(path)
    assert cli.main(["compare", str(path), "--json", "--seed", "3"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    monkeypatch.setattr("sys.stdin", io.StringIO(path.read_text()))
    assert cli.main(["compare", "-", "--json", "--seed", "3"]) == 0
    from_stdin = json.loads(capsys.readouterr().out)
    assert from_stdin["differences"] == from_file["differences"] and from_stdin["source"] == "stdin"
    assert from_file["verdict"]["decision"] == "widen"
    assert from_file["bootstrap"] == {"resamples": 2000, "confidence": 0.95, "seed": 3}
    p99 = next(d for d in from_file["differences"] if d["metric"] == "ttft_p99")
    assert p99["significant"] and p99["ci_low"] <= p99["difference"] <= p99["ci_high"] < 0


def test_cli_json_gives_the_counts_the_text_shows_and_the_rates_by_metric_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text's "timeouts" and "429s" columns are counts; the JSON gave rates under those names (the metric's
    figure replaced the count written before it) and no count at all."""
    path = tmp_path / "out.jsonl"
    lines = [
        {"cohort": cohort, "tier": "interactive", "status": status, "http_status": http, "rollout_fraction": 0.5}
        for cohort in ("guarded", "control")
        for status, http in [("ok", 200)] * 6 + [("timeout", None)] * 3 + [("http_error", 429)]
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli.main(["compare", str(path), "--json"]) == 0
    group = json.loads(capsys.readouterr().out)["groups"][0]
    assert (group["calls"], group["ok"], group["timeout_calls"], group["http_429_calls"]) == (10, 6, 3, 1)
    assert (group["success"], group["timeouts"], group["http_429"]) == pytest.approx((0.6, 0.3, 0.1))
    assert cli.main(["compare", str(path)]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["interactive", "guarded", "10", "60.00%", "3", "1"] in [row[:6] for row in table]  # counts


def test_goodput_scores_both_cohorts_against_one_slo() -> None:
    # guarded: fails fast 20 % of the time (cut at its deadline), else fast; control: always answers, 30 % late.
    calls = [call("guarded", None, "timeout") if i % 5 == 0 else call("guarded", 0.1) for i in range(500)]
    calls += [call("control", 3.0) if i % 10 < 3 else call("control", 0.1) for i in range(2000)]
    metrics = [*METRICS, goodput(1.0)]
    groups = {g.cohort: g.figures for g in summarize(calls, metrics)}
    assert groups["guarded"]["goodput"] == pytest.approx(0.8) and groups["control"]["goodput"] == pytest.approx(0.7)
    good = find(differences(calls, metrics), "goodput")
    assert good.label == "goodput (TTFT<=1s)" and good.interval.low > 0  # +10 pp, while success is -20 pp
    assert find(differences(calls, metrics), "success").interval.high < 0


def test_cli_ttft_slo_adds_a_goodput_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.jsonl"
    write_calls(path)
    assert cli.main(["compare", str(path), "--ttft-slo", "1.0"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("tier "))
    assert "  goodput  " in header and "goodput (TTFT<=1s)" in out


@pytest.mark.parametrize("columns", [80, 60])
def test_cli_text_fits_columns(
    columns: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    path = tmp_path / "out.jsonl"
    write_calls(path)
    assert cli.main(["compare", str(path), "--ttft-slo", "1.0"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= columns, max(out.splitlines(), key=len)
    for header in ("success", "goodput", "TTFT", "p99", "attempts", "server load", "CI", "significant"):
        assert header in out, header
    # a table too wide continues in another that repeats the tier and cohort of each row
    assert sum(line.startswith("tier ") for line in out.splitlines()) >= 2
    assert " ".join(out.split()).endswith("guarded attempts/call 1.047 <= 1.2")


def test_no_records_says_what_to_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "app.log"
    path.write_text('starting\n{"event": "ready"}\n\nstopping\n')
    assert cli.main(["compare", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"no phase records in {path}: read 4 lines, skipped 3 that were not records" in err
    assert "(1 JSON objects without cohort, tier and status)" in err
    assert "through the logging module at INFO" in err and 'RecordLogger("records.jsonl")' in err
    assert "JSON lines, one record per line" in err
    (tmp_path / "empty.jsonl").write_text("")
    assert cli.main(["compare", str(tmp_path / "empty.jsonl")]) == 2
    assert "empty.jsonl: it is empty. Check that the records were written" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["compare", "DATA", "--ttft-slo", "0"], "--ttft-slo must be seconds > 0"),
        (["compare", "/no/such/file.jsonl"], "cannot read /no/such/file.jsonl: No such file or directory"),
        (["compare", "EMPTY"], "no phase records in"),
        (["compare", "DATA", "--tier", "gold"], "--tier gold: not in the records (tiers: interactive)"),
        (["compare", "DATA", "--max-attempts", "0.5"], "max attempts per call must be a number >= 1.0"),
        (["compare", "DATA", "--confidence", "95"], "must be strictly between 0 and 1"),
        (["compare", "DATA", "--resamples", "10"], "--resamples must be at least 100"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    (tmp_path / "empty.jsonl").write_text("nothing here\n")
    write_calls(tmp_path / "data.jsonl", 40, 40)
    files = {"EMPTY": str(tmp_path / "empty.jsonl"), "DATA": str(tmp_path / "data.jsonl")}
    assert cli.main([files.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
