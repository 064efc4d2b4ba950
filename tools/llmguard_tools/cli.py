"""``llmguard``: the load-test harness (``bench``) and the two-scenario ``demo``; this module parses arguments,
`llmguard_tools.bench.commands` runs them.

    llmguard bench (--target URL[,URL...] | --sim SCENARIO) [--clients plain,guarded,...]
                   [--requests N] [--rate R | --profile spike|RATE:SECONDS,...] [--concurrency C]
                   [--seed S] [--length-scale F] [--model M] [--api-key KEY] [--ttft-slo S] [--tpot-slo S]
                   [--tier-ttft S] [--tier-total S] [--tier-stall S|none] [--deadline S]
                   [--replicas K] [--reuse-cluster] [--json PATH|-] [--plot PATH] [--no-progress]
                   [--rollout F [--records PATH]]
    llmguard demo [--seed S] [--json PATH|-] [--plot PATH] [--no-progress]
    llmguard compare RECORDS.jsonl|- [--json] [--tier NAME] [--max-attempts A] [--success-drop D] [--min-calls N]
    llmguard bench --explain        what every figure of the report means
    llmguard rollout get|set FRACTION|kill|clear --fleet URL --name NAME    the fleet-wide rollout flag

Bad input (unknown scenario or client, unreachable URL, non-positive numbers...) prints one line on
stderr and exits with status 2; a failure while running exits 1 (set LLMGUARD_DEBUG=1 for a traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import IO, NoReturn

from llmguard_tools.bench import commands
from llmguard_tools.bench.commands import UsageError

PROG = "llmguard"
DEFAULT_CLIENTS = commands.DEFAULT_CLIENTS


class _Parser(argparse.ArgumentParser):
    lazy_epilog: Callable[[], str] | None = None
    """Computed when the help is shown (the scenario list needs the simulated cluster's import)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def format_help(self) -> str:
        if self.lazy_epilog is not None:
            self.epilog = self.lazy_epilog()
        return super().format_help()


def _scenarios_epilog() -> str:
    """``--sim`` scenarios, one line each, and the rule that invalidates a run."""
    from llmguard_tools.bench.validity import RULE

    try:
        from llmguard_tools.sim.scenarios import SCENARIOS
    except ImportError as exc:
        scenarios = [f"  (the simulated cluster is not available: {exc})"]
    else:
        width = max(len(name) for name in SCENARIOS)
        scenarios = [f"  {name:<{width}}  {s.summary}" for name, s in SCENARIOS.items()]
    rule = textwrap.wrap(RULE + " Re-run with fewer calls/s, fewer clients, or on a quieter machine.", 76)
    return "\n".join(["--sim scenarios:", *scenarios, "", *rule])


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


def _unit_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0.0 to 1.0 (e.g. 0.1), got {text}")
    return value


def _fleet(text: str) -> str:
    """``--fleet``: ``auto``, or a store address checked as the Guard checks it, before any traffic is sent."""
    if text == "auto":
        return text
    from llmguard_client.errors import GuardConfigError
    from llmguard_client.fleet_cli import check_fleet_url

    try:
        return check_fleet_url(text)
    except GuardConfigError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or 'auto' (a local redis-server)") from None


def _stall(text: str) -> float:
    if text.strip().lower() in ("none", "off", "0"):
        return 0.0  # 0 means: no stall limit
    return _positive_float(text)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-' for stdout)")
    p.add_argument(
        "--plot",
        metavar="PATH",
        help="write the latency tails (TTFT and e2e, share of requests slower than x, log-log) as a PNG",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--explain", action="store_true", help="print what every figure of the report means, and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Load-test OpenAI-compatible endpoints with and without llmguard.")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    b = sub.add_parser(
        "bench",
        help="load-test clients side by side on the same seeded traffic",
        description=textwrap.fill(  # filled here: the raw formatter keeps the scenario list below as it is
            "Replay the same seeded traffic through each client, one after another, and report latency "
            "percentiles, goodput, timeouts, 429s and server-side amplification side by side.",
            76,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.lazy_epilog = _scenarios_epilog
    where = b.add_mutually_exclusive_group()  # one of them is required unless --explain
    where.add_argument("--target", metavar="URL[,URL...]", help="replica base URLs (http://host:port)")
    where.add_argument(
        "--sim", metavar="SCENARIO", help="start the simulated cluster with this scenario (listed below)"
    )
    b.add_argument(
        "--clients",
        default=DEFAULT_CLIENTS,
        help="comma-separated, run in this order (default: %(default)s, or the scenario's own; also "
        "guarded-nohedge, guarded-noretry, guarded-affinity, guarded-noaffinity, guarded-admission, guarded-hints)",
    )
    b.add_argument(
        "--continuation",
        action="store_true",
        help="also run guarded-continuation: the guarded client with ContinuationPolicy() (a stream that "
        "breaks after its first token is finished on another replica)",
    )
    b.add_argument("--requests", type=_positive_int, metavar="N", help="logical requests (default: per scenario)")
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
        help="multiply the default request sizes (lognormal: prompt median 57 words, max_tokens median 20, "
        "what the simulated cluster is sized for) by F",
    )
    b.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    b.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' by every client (default: none)")
    slo = b.add_argument_group("goodput SLO (default: per scenario)")
    slo.add_argument("--ttft-slo", type=_positive_float, metavar="S", help="good if TTFT <= S seconds")
    slo.add_argument("--tpot-slo", type=_positive_float, metavar="S", help="good if TPOT <= S seconds per token")
    tier = b.add_argument_group("the guarded client's tier (default: per scenario)")
    tier.add_argument("--tier-ttft", type=_positive_float, metavar="S", help="seconds to the first token")
    tier.add_argument("--tier-total", type=_positive_float, metavar="S", help="also the baselines' give-up time")
    tier.add_argument("--tier-stall", type=_stall, metavar="S", help="seconds, or 'none'")
    b.add_argument(
        "--deadline",
        type=_positive_float,
        metavar="S",
        help="harness give-up time per request (default: tier total)",
    )
    sim = b.add_argument_group("--sim only")
    sim.add_argument("--replicas", type=_positive_int, metavar="K", help="override the scenario's replica count")
    sim.add_argument(
        "--reuse-cluster",
        action="store_true",
        help="one cluster for all clients, POST /sim/reset between them (default: a fresh cluster per "
        "client, so each client meets the same seeded faults)",
    )
    b.add_argument(
        "--tier-mix",
        metavar="TIER:SHARE",
        help="send this share of the calls on another tier, e.g. batch:0.3 (30 %% on the batch tier: 30 s to the "
        "first token, 600 s in all; x-llmguard-tier for the guarded clients), and report each tier's figures",
    )
    split = b.add_argument_group("load generators in several processes (open-loop plans)")
    split.add_argument(
        "--client-processes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="replay each baseline's plan (plain, openai-default, naive-retry: every call independent) from N "
        "processes, each sending every Nth call, so that a client with hundreds of calls in flight does not "
        "starve its own load generator (default: %(default)s)",
    )
    split.add_argument(
        "--guard-processes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="the same for the guarded clients: N processes, each with a Guard of its own (default: %(default)s, "
        "one Guard)",
    )
    fleet = b.add_argument_group("across processes (--sim with a provider rate limit, e.g. ratelimited)")
    fleet.add_argument(
        "--processes",
        type=_positive_int,
        metavar="N",
        help="N client processes, each with its own Guard: plain, guarded per-process and guarded fleet side by side",
    )
    fleet.add_argument(
        "--fleet",
        type=_fleet,
        metavar="URL",
        help="Redis URL of the fleet-wide rate limit, or 'auto' (a local redis-server); without --processes: the "
        "store every guarded client's Guard shares its fleet state through (e.g. with --guard-processes N)",
    )
    fleet.add_argument(
        "--fleet-connect",
        choices=("early", "first-call"),
        default="early",
        help="when each fleet Guard connects its store: 'early' (entered with async with before the traffic "
        "starts, the default) or 'first-call' (on its first call, as a Guard used without async with)",
    )
    _add_output_options(b)
    b.add_argument(
        "--hints-every",
        type=_positive_float,
        metavar="S",
        help="seconds between the guarded-hints client's polls of each replica's /metrics "
        "(default: poll_vllm_metrics's, 0.1; at least 0.1)",
    )
    ro = b.add_argument_group("rollout (docs/rollout.md)")
    ro.add_argument(
        "--rollout",
        type=_unit_fraction,
        metavar="F",
        help="run the 'rollout' client: one Guard guarding fraction F of the stream, the rest passed through "
        "as the control cohort (without --clients: that client only; default F with --clients rollout: 0.1)",
    )
    ro.add_argument(
        "--records", metavar="PATH", help="the rollout client's phase records as JSON lines, for llmguard compare"
    )

    d = sub.add_parser(
        "demo",
        help="stragglers and collapse on the simulated cluster (~2 min)",
        description="Run the 'stragglers' scenario (slow first tokens; plain vs guarded) and the 'collapse' "
        "scenario (a 3x traffic spike on engines that queue without limit; plain, guarded and guarded with "
        "admission) on the simulated cluster, and print each report with one verdict per client.",
    )
    d.add_argument("--seed", type=int, default=0, help="traffic and simulated-cluster seed (default: %(default)s)")
    _add_output_options(d)

    from llmguard_tools.compare.command import add_parser as add_compare

    add_compare(sub)
    from llmguard_client.fleet_cli import add_parser as add_rollout

    add_rollout(sub)
    parser.usage = f"%(prog)s [-h] {{{','.join(sub.choices)}}} ..."  # every command, none left out
    return parser


def _compare(args: argparse.Namespace) -> int:
    from llmguard_tools.compare.command import InputError, run

    try:
        return run(args)
    except InputError as exc:
        raise UsageError(str(exc)) from None


def _rollout(args: argparse.Namespace) -> int:
    from llmguard_client.errors import GuardConfigError
    from llmguard_client.fleet_cli import FleetCommandError, run

    try:
        return run(args, prog=PROG)
    except GuardConfigError as exc:
        raise UsageError(str(exc)) from None
    except FleetCommandError as exc:
        _fail(str(exc))
        return 1


def _run(args: argparse.Namespace) -> int:
    """``bench`` or ``demo``: long runs with child processes, stopped as a whole by Ctrl-C."""
    if args.command == "bench" and args.processes:
        from llmguard_tools.bench.processes import run_processes

        return run_processes(args)
    if args.command == "bench":
        return commands.run_bench(args)
    return commands.run_demo(args)


def _fail(message: str, stream: IO[str] | None = None) -> None:
    line = " ".join(message.split())  # always exactly one line
    print(f"{PROG}: error: {line}", file=stream or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "compare":
            return _compare(args)
        if args.command == "rollout":
            return _rollout(args)
        if args.explain:
            return commands.explain(args)
        if args.command == "bench" and not (args.target or args.sim):
            raise UsageError("one of the arguments --target --sim is required (or --explain)")
        from llmguard_tools.bench.interrupt import EXIT_STATUS, run_interruptibly

        status = run_interruptibly(lambda: _run(args), _fail)
        if status == EXIT_STATUS:  # stopped by Ctrl-C and on its way out: a late SIGINT must not make it -2
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return status
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
