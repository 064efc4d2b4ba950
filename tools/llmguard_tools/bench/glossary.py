"""What every figure in a bench report means: ``llmguard bench --explain``.

One entry per column of the tables (`llmguard_tools.bench.tables`) and per term of the verdicts
(`llmguard_tools.bench.verdict`); a test checks that every column header is explained here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmguard_tools.bench.validity import RULE

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["GLOSSARY", "render_glossary"]

GLOSSARY: tuple[tuple[str, str], ...] = (
    (
        "requests",
        "Logical requests: one per planned arrival. Every client replays the same seeded plan (arrival "
        "times, prompt and output lengths), one client after the other.",
    ),
    ("success", "Share of requests that streamed to the end ([DONE]) with HTTP 200."),
    (
        "goodput",
        "Share of requests that succeeded within the service-level objective: time to first token and time "
        "per output token both within the limits printed above the tables. Good completions over arrivals.",
    ),
    (
        "timeouts",
        "Share that ended in a client-side timeout (the harness deadline, the SDK's or the guard's) or an "
        "HTTP 408 / 504.",
    ),
    ("429s", "Share whose final answer was HTTP 429: the servers refused the request (rate limit, admission)."),
    ("other errors", "Every other failure: 5xx answers, connection resets, broken streams, error events."),
    (
        "TTFT",
        "Time to first token: from sending the request to the first streamed event carrying content, "
        "including every retry, hedge and wait on the way. p50 / p95 / p99: the median and the tail, over "
        "successful requests.",
    ),
    ("e2e", "End to end: from sending the request to the end of the stream, over successful requests."),
    (
        "TPOT",
        "Time per output token after the first: (e2e - TTFT) / (tokens - 1), the pace of the stream.",
    ),
    (
        "÷ plain",
        "The row above divided by the plain client's figure: below 1.00x the client is faster.",
    ),
    (
        "to fail",
        "For failed requests: time until the client had its final error, minus the waits it chose to honour "
        "(Retry-After, backoff). How long a caller waits to learn that a request failed.",
    ),
    (
        "own time",
        "Guarded clients only: time to fail minus honoured waits minus time with an attempt in flight; the "
        "guard's own overhead on a failure.",
    ),
    (
        "refused",
        "Guarded clients with admission only: for the calls it refused before sending them (a 429 with "
        "x-llmguard-cause: overloaded), the time from the call's start until the caller had the refusal.",
    ),
    (
        "attempts / call",
        "Physical HTTP attempts the client made per logical request, retries and hedges included ('-' when the "
        "client cannot count them).",
    ),
    (
        "server req / call",
        "Amplification: requests the servers received per logical request. 1.00 adds no load; every retry "
        "or hedge that reaches a server adds to it. Under overload, a retry storm shows here.",
    ),
    (
        "/metrics / call",
        "GET /metrics the servers answered during the client's run, per logical request: the cost of a guarded "
        "client's server hints (poll_vllm_metrics), not counted in server req / call ('-': none; the column is left "
        "out when no client polled).",
    ),
    ("rejected", "Requests the servers refused (HTTP 429 from admission control)."),
    (
        "preempted",
        "Times a server evicted a running request from its KV cache under memory pressure; the work is redone later.",
    ),
    ("work tokens", "Tokens the servers computed: prefill (recomputation included) plus decode."),
    (
        "wasted",
        "Work the servers did for requests whose client went away before the end (hedge losers closed, "
        "deadlines), in tokens and as a share of the work tokens.",
    ),
    (
        "queue back after spike",
        "Seconds from the end of a spike (the peak segment of a --profile such as 'spike') until the servers' "
        "waiting queues, summed, are back to their depth before it ('> N s': not within the N s observed; '-': "
        "no spike or no server history). Without admission an engine's queue keeps growing after the spike.",
    ),
    (
        "loser aborts",
        "Server-side requests ended because the client disconnected: hedge losers the guard closed, requests "
        "cut by a deadline. Each one stops wasting work on the server.",
    ),
    (
        "verdict",
        "One line per client. A guarded client is compared with every baseline that ran (plain, "
        "openai-default, naive-retry), on each figure with the baseline that did best on it, named in the "
        "line; a baseline is compared with plain. The line gives the headline (TTFT p99 at a server load, or "
        "goodput and success under overload), the best gain and the worst regression, ranked by the factor "
        "between the two figures; shares of failed requests are compared with one point added to both "
        "(0% -> 2.8% is 3.8x), and factors within 5% of 1 count as neither. When the guarded client succeeds "
        "less often because its deadlines cut requests that a baseline finished later than the tier allows, "
        "one more sentence says so.",
    ),
    (
        "on plan / INVALID",
        "How far the load generator fell behind the planned arrivals (waits for a --concurrency slot do not "
        "count). " + RULE + " A generator that cannot send on time cannot time first tokens or fire deadlines "
        "on time either: re-run with fewer calls/s, fewer clients, or on a quieter machine.",
    ),
    (
        "percentiles",
        "Linear interpolation between the closest ranks (numpy's default); p99 of 500 requests is decided by "
        "the slowest five.",
    ),
)
"""(term, definition), in the order of the report."""


def render_glossary(console: Console) -> None:
    """Print the glossary as a two-column grid that wraps to the console's width."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for term, text in GLOSSARY:
        grid.add_row(term, text)
    console.print("[bold]What the bench reports[/bold]")
    console.print(grid)
