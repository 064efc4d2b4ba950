"""What ``llmguard bench`` and ``llmguard demo`` do once their arguments are parsed (`llmguard_tools.cli`).

Bad input raises `UsageError` (one line on stderr, exit status 2). Heavy imports (anyio, rich, matplotlib,
the simulated cluster) happen inside the commands, so ``llmguard --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmguard_tools.bench.report import BenchReport
    from llmguard_tools.bench.runlog import RunLog
    from llmguard_tools.bench.spec import RunSpec
    from llmguard_tools.bench.summary import SLO

__all__ = ["UsageError", "explain", "run_bench", "run_demo"]


DEFAULT_CLIENTS = "plain,openai-default,naive-retry,guarded"


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


def explain(args: argparse.Namespace) -> int:
    """``--explain``: print what every figure of the report means."""
    from llmguard_tools.bench.glossary import render_glossary

    render_glossary(_console(to_stderr=False))
    return 0


def _sim_api(scenario: str) -> Callable[..., contextlib.AbstractContextManager[list[str]]]:
    """``spawn_cluster`` after checking ``scenario`` exists; UsageError if the sim is missing."""
    try:
        scenarios = importlib.import_module("llmguard_tools.sim.scenarios")
        launch = importlib.import_module("llmguard_tools.sim.launch")
        names = sorted(scenarios.SCENARIOS)
        spawn: Callable[..., contextlib.AbstractContextManager[list[str]]] = launch.spawn_cluster
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--sim needs the simulated cluster (llmguard_tools.sim), not available: {exc}") from None
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
    from llmguard_tools.bench.runner import NullProgress

    if not enabled:
        yield NullProgress()
        return
    try:
        from llmguard_tools.bench.progress import RichProgress

        bar = RichProgress()
    except ImportError:
        yield NullProgress()
        return
    with bar:
        yield bar


@contextlib.contextmanager
def _live_logs(logs: RunLog, bar: object) -> Iterator[None]:
    """While the progress bars are live, log records are printed above them, on their console."""
    logs.live = getattr(bar, "console", None)
    try:
        yield
    finally:
        logs.live = None


def _console(to_stderr: bool) -> Any:
    try:
        from llmguard_tools.bench.tables import make_console

        return make_console(stderr=to_stderr)
    except ImportError as exc:
        raise UsageError(
            f"the report needs rich (a dependency of llmguard-tools: pip install -e ./tools in a checkout): {exc}"
        ) from None


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
            raise UsageError(
                "--plot needs matplotlib (a dependency of llmguard-tools: pip install -e ./tools in a checkout)"
            ) from None


def _check_hints_every(every: float | None, clients: Sequence[str]) -> None:
    if every is None:
        return
    if "guarded-hints" not in clients:
        raise UsageError("--hints-every needs the guarded-hints client (--clients ...,guarded-hints)")
    shortest = importlib.import_module("llmguard_client.server_hints").MIN_EVERY
    if every < shortest:
        raise UsageError(f"--hints-every: must be at least {shortest:g} seconds, got {every:g}")


def _need_guard(clients: Sequence[str]) -> None:
    if any(c.startswith("guarded") or c == "rollout" for c in clients):
        from llmguard_tools.bench.clients import guard_api

        try:
            guard_api()
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None


def run_bench(args: argparse.Namespace) -> int:
    """``llmguard bench``: replay the plan through each client, print the report, write --json / --plot."""
    import anyio

    from llmguard_tools.bench.clients import TierSpec, parse_clients
    from llmguard_tools.bench.conversations import make_conversation_plan
    from llmguard_tools.bench.plot import plot_latency
    from llmguard_tools.bench.prefix_report import cache_lines
    from llmguard_tools.bench.presets import preset_for
    from llmguard_tools.bench.processes import fleet_url
    from llmguard_tools.bench.rates import parse_profile
    from llmguard_tools.bench.runlog import captured
    from llmguard_tools.bench.runner import preflight
    from llmguard_tools.bench.shards import shard_plan
    from llmguard_tools.bench.spec import RunSpec
    from llmguard_tools.bench.summary import SLO
    from llmguard_tools.bench.tables import render
    from llmguard_tools.bench.tiermix import assign, parse_tier_mix
    from llmguard_tools.bench.traffic import make_plan

    _check_outputs(args)
    try:
        clients = parse_clients(args.clients)
        profile = parse_profile(args.profile) if args.profile else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "continuation", False):  # the guarded client with continuation on, right after it
        at = clients.index("guarded") + 1 if "guarded" in clients else len(clients)
        if "guarded-continuation" not in clients:
            clients.insert(at, "guarded-continuation")
    if args.rollout is not None and args.clients == DEFAULT_CLIENTS:
        clients = ["rollout"]
    if args.records and "rollout" not in clients:
        raise UsageError("--records needs the rollout client (--rollout F, or --clients ...,rollout)")
    records_dir = os.path.dirname(os.path.abspath(args.records)) if args.records else None
    if records_dir is not None and not os.path.isdir(records_dir):
        raise UsageError(f"--records {args.records}: directory {records_dir} does not exist")
    if args.reuse_cluster and not args.sim:
        raise UsageError("--reuse-cluster needs --sim")
    if args.replicas and not args.sim:
        raise UsageError("--replicas needs --sim")
    spawn = _sim_api(args.sim) if args.sim else None
    urls = _parse_targets(args.target) if args.target else None
    _need_guard(clients)

    preset = preset_for(args.sim)
    if preset.clients and args.clients == DEFAULT_CLIENTS and args.rollout is None:
        clients = list(preset.clients)  # e.g. multiturn: round-robin, guarded without and with cache affinity
    _check_hints_every(args.hints_every, clients)
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
        plan = (make_conversation_plan if preset.conversations else make_plan)(
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
        from llmguard_tools.bench.runner import TargetError

        try:
            anyio.run(preflight, urls, 3.0, args.api_key)
        except TargetError as exc:
            raise UsageError(str(exc)) from None

    spec = RunSpec(plan=plan, tier=tier, model=args.model, deadline=args.deadline, api_key=args.api_key)
    spec.rollout, spec.records, spec.hints_every = args.rollout, args.records, args.hints_every
    if args.tier_mix:
        try:
            spec.tiers = assign(len(plan.requests), parse_tier_mix(args.tier_mix), args.seed)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    spec.processes = _processes(clients, args.client_processes, args.guard_processes)
    if any(n > 1 for n in spec.processes.values()):
        try:
            shard_plan(plan, 0, 1)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    to_stderr = args.json == "-"
    console = _console(to_stderr)
    with captured() as logs, fleet_url(args.fleet) as fleet:
        if fleet is not None:
            spec.fleet = (fleet, f"bench{os.getpid()}")
        report = _bench_run(args, spec, slo, clients, spawn, urls, logs)
        render(report, console)
        for line in cache_lines(report.runs, plan):
            console.print(line, highlight=False)
        if args.json:
            _write_json(report.to_dict(), args.json)
        if args.plot:
            plot_latency([report], args.plot)
            console.print(f"Latency plot written to {args.plot}")
        if args.records:
            console.print(f"phase records written to {args.records}: llmguard compare {args.records}")
        logs.print_after(console)
    return 0


def _processes(clients: list[str], baselines: int, guarded: int) -> dict[str, int]:
    """Client -> the processes replaying its plan: ``--client-processes`` for the baselines,
    ``--guard-processes`` for the guarded clients (the rollout client stays in one)."""
    from llmguard_tools.bench.validity import is_baseline

    return {c: (baselines if is_baseline(c) else guarded) for c in clients if c != "rollout"}


def _bench_run(
    args: argparse.Namespace,
    spec: RunSpec,
    slo: SLO,
    clients: list[str],
    spawn: Callable[..., contextlib.AbstractContextManager[list[str]]] | None,
    urls: list[str] | None,
    logs: RunLog,
) -> BenchReport:
    """Run every client of ``llmguard bench``; log records emitted while the bars are live go above them."""
    from llmguard_tools.bench.report import BenchReport
    from llmguard_tools.bench.runner import run_clients

    with _progress(not args.no_progress) as bar, _live_logs(logs, bar):
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
        plan=spec.plan,
        slo=slo,
        tier=spec.tier,
        counters=counters,
        model=model,
        runs=runs,
        scenario=args.sim,
        target=urls or [],
        hints_every=spec.hints_every,
    )
    return report


def run_demo(args: argparse.Namespace) -> int:
    """``llmguard demo``: the stragglers and collapse scenarios on the simulated cluster, then a summary."""
    import time

    from llmguard_tools.bench.plot import plot_latency
    from llmguard_tools.bench.presets import DEMO_CLIENTS, DEMO_SCENARIOS
    from llmguard_tools.bench.runlog import captured
    from llmguard_tools.bench.tables import EXPLAIN_HINT, hanging

    _check_outputs(args)
    spawns = {name: _sim_api(name) for name in DEMO_SCENARIOS}
    _need_guard([c for clients in DEMO_CLIENTS.values() for c in clients])
    to_stderr = args.json == "-"
    console = _console(to_stderr)
    reports: list[BenchReport] = []
    t0 = time.perf_counter()
    with captured() as logs:
        _demo_scenarios(args, console, spawns, reports, logs)
    console.print(f"[bold]demo summary[/bold] ({time.perf_counter() - t0:.0f} s):")
    for r in reports:  # a verdict per guarded client (collapse's admission beside the guard's defaults)
        console.print(hanging(f"  {r.scenario}:", list(r.verdicts().values()) or [r.interpretation()]))
    console.print(f"[dim]{EXPLAIN_HINT}[/dim]")
    if args.json:
        _write_json({"demo": [r.to_dict() for r in reports]}, args.json)
    if args.plot:
        plot_latency(reports, args.plot)
        console.print(f"Latency plot written to {args.plot}")
    return 0


def _demo_scenarios(
    args: argparse.Namespace,
    console: Any,
    spawns: dict[str, Callable[..., contextlib.AbstractContextManager[list[str]]]],
    reports: list[BenchReport],
    logs: RunLog,
) -> None:
    """Run and print each demo scenario, appending its report to ``reports``."""
    from llmguard_tools.bench.presets import DEMO_CLIENTS, DEMO_SCENARIOS, preset_for
    from llmguard_tools.bench.rates import parse_profile
    from llmguard_tools.bench.report import BenchReport
    from llmguard_tools.bench.runner import run_clients
    from llmguard_tools.bench.spec import RunSpec
    from llmguard_tools.bench.tables import render
    from llmguard_tools.bench.traffic import make_plan

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
        with _progress(not args.no_progress) as bar, _live_logs(logs, bar):
            runs, counters, model = run_clients(
                DEMO_CLIENTS[scenario], spec, cluster=cluster, fresh_cluster=True, progress=bar
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
        render(report, console, explain_hint=False)
        logs.print_after(console)  # below the report, never inside it
        console.print()
        reports.append(report)
