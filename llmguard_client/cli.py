"""``llmguard``: the load-test harness (``bench``) and the two-scenario ``demo``.

    llmguard bench (--target URL[,URL...] | --sim SCENARIO) [--clients plain,guarded,...]
                   [--requests N] [--rate R | --profile spike|RATE:SECONDS,...] [--concurrency C]
                   [--seed S] [--length-scale F] [--model M] [--api-key KEY] [--ttft-slo S] [--tpot-slo S]
                   [--tier-ttft S] [--tier-total S] [--tier-stall S|none] [--deadline S]
                   [--replicas K] [--reuse-cluster] [--json PATH|-] [--plot PATH] [--no-progress]
    llmguard demo [--seed S] [--json PATH|-] [--plot PATH] [--no-progress]

Bad input (unknown scenario or client, unreachable URL, non-positive numbers...) prints one line on
stderr and exits with status 2; a failure while running exits 1 (set LLMGUARD_DEBUG=1 for a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, NoReturn

PROG = "llmguard"


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _stall(text: str) -> float:
    if text.strip().lower() in ("none", "off", "0"):
        return 0.0  # 0 means: no stall limit
    return _positive_float(text)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-' for stdout)")
    p.add_argument("--plot", metavar="PATH", help="write latency CDFs (TTFT and e2e panels) as a PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, description="Load-test OpenAI-compatible endpoints with and without llmguard."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,demo}")

    b = sub.add_parser(
        "bench",
        help="replay the same planned traffic through several clients and compare them",
        description="Replay the same seeded traffic through each client, one after another, and report "
        "latency percentiles, goodput, timeouts, 429s and server-side amplification side by side.",
    )
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", metavar="URL[,URL...]", help="replica base URLs (http://host:port)")
    where.add_argument("--sim", metavar="SCENARIO", help="start the simulated cluster with this scenario")
    b.add_argument(
        "--clients",
        default="plain,openai-default,naive-retry,guarded",
        help="comma-separated, run in this order (default: %(default)s; "
        "also guarded-nohedge, guarded-noretry)",
    )
    b.add_argument(
        "--requests", type=_positive_int, metavar="N", help="logical requests (default: per scenario)"
    )
    load = b.add_argument_group("load shape (default: per scenario)")
    load.add_argument(
        "--rate",
        type=_positive_float,
        metavar="R",
        help="open-loop Poisson rate, or a --profile's base rate (rps)",
    )
    load.add_argument(
        "--profile",
        metavar="P",
        help="'spike' (base -> 4.67x base -> base) or RATE:SECONDS[,RATE:SECONDS...]",
    )
    load.add_argument(
        "--concurrency",
        type=_positive_int,
        metavar="C",
        help="closed loop with C workers; with --rate/--profile: at most C requests in flight",
    )
    b.add_argument("--seed", type=int, default=0, help="traffic (and sim) seed (default: %(default)s)")
    b.add_argument(
        "--length-scale",
        type=_positive_float,
        metavar="F",
        help="multiply the default lengths (the seed's lognormal mix scaled to the sim: prompt median "
        "57 words, max_tokens median 20) by F",
    )
    b.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    b.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' by every client (default: none)")
    slo = b.add_argument_group("goodput SLO (default: per scenario)")
    slo.add_argument("--ttft-slo", type=_positive_float, metavar="S", help="good if TTFT <= S seconds")
    slo.add_argument(
        "--tpot-slo", type=_positive_float, metavar="S", help="good if TPOT <= S seconds per token"
    )
    tier = b.add_argument_group("the guarded client's tier (default: per scenario)")
    tier.add_argument("--tier-ttft", type=_positive_float, metavar="S")
    tier.add_argument(
        "--tier-total", type=_positive_float, metavar="S", help="also the baselines' give-up time"
    )
    tier.add_argument("--tier-stall", type=_stall, metavar="S", help="seconds, or 'none'")
    b.add_argument(
        "--deadline",
        type=_positive_float,
        metavar="S",
        help="harness give-up time per request (default: tier total)",
    )
    sim = b.add_argument_group("--sim only")
    sim.add_argument(
        "--replicas", type=_positive_int, metavar="K", help="override the scenario's replica count"
    )
    sim.add_argument(
        "--reuse-cluster",
        action="store_true",
        help="one cluster for all clients, POST /sim/reset between them (default: a fresh cluster per "
        "client, so each client meets the same seeded faults)",
    )
    _add_output_options(b)

    d = sub.add_parser(
        "demo",
        help="stragglers and overload, plain vs guarded, on the simulated cluster (< 2 min)",
        description="Run the 'stragglers' and 'overload' scenarios with the plain and guarded clients "
        "and print both tables with a one-line reading of each.",
    )
    d.add_argument("--seed", type=int, default=0)
    _add_output_options(d)
    return parser


# ---------------------------------------------------------------- helpers


def _sim_api(scenario: str) -> Callable[..., contextlib.AbstractContextManager[list[str]]]:
    """``spawn_cluster`` after checking ``scenario`` exists; UsageError if the sim is missing."""
    try:
        scenarios = importlib.import_module("llmguard_client.sim.scenarios")
        launch = importlib.import_module("llmguard_client.sim.launch")
        names = sorted(scenarios.SCENARIOS)
        spawn: Callable[..., contextlib.AbstractContextManager[list[str]]] = launch.spawn_cluster
    except (ImportError, AttributeError) as exc:
        raise UsageError(
            f"--sim needs the simulated cluster (llmguard_client.sim), not available: {exc}"
        ) from None
    if scenario not in names:
        raise UsageError(f"unknown scenario {scenario!r}; choose from {', '.join(names)}")
    return spawn


def _parse_targets(spec: str) -> list[str]:
    urls = [u.strip().rstrip("/") for u in spec.split(",") if u.strip()]
    if not urls:
        raise UsageError("--target needs at least one URL")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise UsageError(f"--target {u!r} is not an http:// or https:// URL")
    return urls


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    from llmguard_client.bench.runner import NullProgress

    if not enabled:
        yield NullProgress()
        return
    try:
        from llmguard_client.bench.report import RichProgress

        bar = RichProgress()
    except ImportError:
        yield NullProgress()
        return
    with bar:
        yield bar


def _console(to_stderr: bool) -> Any:
    try:
        from llmguard_client.bench.report import make_console

        return make_console(stderr=to_stderr)
    except ImportError as exc:
        raise UsageError(f"the report needs rich (pip install 'llmguard-client[sim]'): {exc}") from None


def _write_json(doc: dict[str, Any], path: str) -> None:
    text = json.dumps(doc, indent=2, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def _check_outputs(args: argparse.Namespace) -> None:
    for opt in ("json", "plot"):
        path = getattr(args, opt)
        if path and path != "-":
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise UsageError(f"--{opt} {path}: directory {parent} does not exist")
    if args.plot == "-":
        raise UsageError("--plot needs a file path")
    if args.plot:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise UsageError("--plot needs matplotlib (pip install 'llmguard-client[sim]')") from None


def _need_guard(clients: Sequence[str]) -> None:
    if any(c.startswith("guarded") for c in clients):
        from llmguard_client.bench.clients import guard_api

        try:
            guard_api()
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None


# ---------------------------------------------------------------- commands


def _bench(args: argparse.Namespace) -> int:
    import anyio

    from llmguard_client.bench.clients import TierSpec, parse_clients
    from llmguard_client.bench.presets import preset_for
    from llmguard_client.bench.rates import parse_profile
    from llmguard_client.bench.report import SLO, BenchReport, plot_cdfs, render
    from llmguard_client.bench.runner import RunSpec, preflight, run_clients
    from llmguard_client.bench.traffic import make_plan

    _check_outputs(args)
    try:
        clients = parse_clients(args.clients)
        profile = parse_profile(args.profile) if args.profile else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.reuse_cluster and not args.sim:
        raise UsageError("--reuse-cluster needs --sim")
    if args.replicas and not args.sim:
        raise UsageError("--replicas needs --sim")
    spawn = _sim_api(args.sim) if args.sim else None
    urls = _parse_targets(args.target) if args.target else None
    _need_guard(clients)

    preset = preset_for(args.sim)
    rate, concurrency = args.rate, args.concurrency
    if profile is None and rate is None and concurrency is None:
        rate, concurrency = preset.rate, preset.concurrency
        profile = parse_profile(preset.profile) if preset.profile else None
    tier = TierSpec(
        ttft=args.tier_ttft or preset.tier.ttft,
        total=args.tier_total or preset.tier.total,
        stall=preset.tier.stall if args.tier_stall is None else (args.tier_stall or None),
    )
    if tier.ttft > tier.total:
        raise UsageError(f"--tier-ttft ({tier.ttft:g}) must not exceed --tier-total ({tier.total:g})")
    slo = SLO(ttft=args.ttft_slo or preset.slo.ttft, tpot=args.tpot_slo or preset.slo.tpot)
    try:
        plan = make_plan(
            args.requests or preset.requests,
            seed=args.seed,
            lengths=preset.lengths.scaled(args.length_scale) if args.length_scale else preset.lengths,
            rate=rate,
            profile=profile,
            concurrency=concurrency,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if urls is not None:
        from llmguard_client.bench.runner import TargetError

        try:
            anyio.run(preflight, urls, 3.0, args.api_key)
        except TargetError as exc:
            raise UsageError(str(exc)) from None

    spec = RunSpec(plan=plan, tier=tier, model=args.model, deadline=args.deadline, api_key=args.api_key)
    to_stderr = args.json == "-"
    console = _console(to_stderr)
    with _progress(not args.no_progress) as bar:
        if spawn is not None:
            scenario = args.sim

            def cluster() -> contextlib.AbstractContextManager[list[str]]:
                return spawn(scenario, replicas=args.replicas, seed=args.seed)

            runs, counters, model = run_clients(
                clients, spec, cluster=cluster, fresh_cluster=not args.reuse_cluster, progress=bar
            )
        else:
            runs, counters, model = run_clients(clients, spec, urls=urls, progress=bar)
    report = BenchReport(
        title=f"sim:{args.sim}" if args.sim else "target",
        plan=plan,
        slo=slo,
        tier=tier,
        counters=counters,
        model=model,
        runs=runs,
        scenario=args.sim,
        target=urls or [],
    )
    render(report, console)
    if args.json:
        _write_json(report.to_dict(), args.json)
    if args.plot:
        plot_cdfs([report], args.plot)
        console.print(f"CDF plot written to {args.plot}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    import time

    from llmguard_client.bench.presets import DEMO_CLIENTS, DEMO_SCENARIOS, preset_for
    from llmguard_client.bench.rates import parse_profile
    from llmguard_client.bench.report import BenchReport, plot_cdfs, render
    from llmguard_client.bench.runner import RunSpec, run_clients
    from llmguard_client.bench.traffic import make_plan

    _check_outputs(args)
    spawns = {name: _sim_api(name) for name in DEMO_SCENARIOS}
    _need_guard(DEMO_CLIENTS)
    to_stderr = args.json == "-"
    console = _console(to_stderr)
    reports: list[BenchReport] = []
    t0 = time.perf_counter()
    for scenario in DEMO_SCENARIOS:
        preset = preset_for(scenario)
        plan = make_plan(
            preset.requests,
            seed=args.seed,
            lengths=preset.lengths,
            rate=preset.rate,
            profile=parse_profile(preset.profile) if preset.profile else None,
            concurrency=preset.concurrency,
        )
        spec = RunSpec(plan=plan, tier=preset.tier)
        spawn = spawns[scenario]

        def cluster(
            spawn: Callable[..., contextlib.AbstractContextManager[list[str]]] = spawn,
            scenario: str = scenario,
        ) -> contextlib.AbstractContextManager[list[str]]:
            return spawn(scenario, seed=args.seed)

        console.print(f"[bold]== {scenario}[/bold]: {preset.note}")
        with _progress(not args.no_progress) as bar:
            runs, counters, model = run_clients(
                DEMO_CLIENTS, spec, cluster=cluster, fresh_cluster=True, progress=bar
            )
        report = BenchReport(
            title=f"sim:{scenario}",
            plan=plan,
            slo=preset.slo,
            tier=preset.tier,
            counters=counters,
            model=model,
            runs=runs,
            scenario=scenario,
        )
        render(report, console)
        console.print()
        reports.append(report)
    console.print(f"[bold]demo summary[/bold] ({time.perf_counter() - t0:.0f} s):")
    for r in reports:
        console.print(f"  {r.scenario}: {r.interpretation()}")
    if args.json:
        _write_json({"demo": [r.to_dict() for r in reports]}, args.json)
    if args.plot:
        plot_cdfs(reports, args.plot)
        console.print(f"CDF plot written to {args.plot}")
    return 0


def _fail(message: str, stream: IO[str] | None = None) -> None:
    line = " ".join(message.split())  # always exactly one line
    print(f"{PROG}: error: {line}", file=stream or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "bench":
            return _bench(args)
        return _demo(args)
    except UsageError as exc:
        _fail(str(exc))
        return 2
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except Exception as exc:
        if os.environ.get("LLMGUARD_DEBUG"):
            raise
        _fail(f"{type(exc).__name__}: {exc} (set LLMGUARD_DEBUG=1 for a traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
