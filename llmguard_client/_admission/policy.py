"""`Admission`: the public policy of client-side adaptive admission (``Guard(admission=Admission())``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmguard_client.errors import GuardConfigError

__all__ = ["Admission"]


def _check(
    name: str, value: float, low: float, high: float = math.inf, *, open_low: bool = False, integer: bool = False
) -> None:
    kinds = int if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or (value <= low if open_low else value < low):
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        kind = "an integer " if integer else ""
        raise GuardConfigError(f"Admission: {name} must be {kind}{bound} and <= {high:g}, got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise GuardConfigError(f"Admission: {name} must be True or False, got {value!r}")


@dataclass(frozen=True, slots=True)
class Admission:
    """Adaptive admission per replica: the guard learns how many attempts each replica can hold and still give
    a first token within the tier's ``ttft``, sends no more than that, queues the rest by deadline, and refuses
    at once (`Overloaded`, with a computed ``retry_after``) a call that could not get its first token in time.

    initial_limit: attempts in flight per replica before anything is learned.
    min_limit / max_limit: bounds of the learned limit.
    target:        the TTFT the limit aims at, as a fraction of the tier's ``ttft`` (the gradient's anchor):
                   the limit grows while first tokens come faster than ``target x ttft`` and the limit is in
                   use, and shrinks in proportion to the load they met when they come slower.
    growth:        slots the limit gains per first token that came in time while in use, at most (less as
                   first tokens approach the target); and loses per one while not in use, down to the load
                   proven in time. A limit that came down so, with no sign of overload, paces the calls past
                   it (they wait for it to grow back) instead of refusing them.
    backoff:       factor applied to the limit when the replica signals overload (429, 503, in-stream
                   overload), or reports a waiting queue longer than ``max_server_queue``.
    max_waiting:   calls waiting for a replica's slot at most, of every tier; past it, refused at once.
    max_queue_wait: the longest a call of the most urgent tier (the shortest ``ttft``) that signs of overload
                   keep out waits for a slot, as a fraction of that ``ttft``; a call that would wait longer is
                   refused at once, and one still waiting then is refused. A call of a longer tier, or one kept
                   out only by a limit that came down with no sign of overload, waits as long as its first
                   token can still come in time.
    reserve:       the share of each replica's limit kept for calls of the most urgent tier: a call of a
                   longer tier (batch) takes a slot only below the rest, so that under a spike it waits
                   and runs after it instead of taking the places of calls that cannot wait.
    max_server_queue: the longest waiting queue a replica may report (ORCA header, ``/metrics``) before the
                   limit backs off.
    signal_fresh_for: seconds a replica's own load report in an answer's header is believed (older: ignored).
    ask_load_reports: send ``endpoint-load-metrics-format: text`` on non-streamed calls, so that vLLM answers
                   with its queue and KV use (ORCA).
    send_slo:      send the tier's first-token deadline as ``x-slo-ttft-ms`` on every attempt (the time left
                   for that attempt), so that an SLO-aware scheduler (llm-d) can order its queue by it.
    by_size:       count each attempt by its call's size (body and ``max_tokens``) against the average call's,
                   instead of as one: the limits are in calls of an average size, and a replica holds more
                   small calls than large ones.
    """

    initial_limit: int = 16
    min_limit: int = 1
    max_limit: int = 1024
    target: float = 0.6
    growth: float = 0.75
    backoff: float = 0.9
    max_waiting: int = 128
    max_queue_wait: float = 0.08
    reserve: float = 0.25
    max_server_queue: int = 4
    signal_fresh_for: float = 0.2
    ask_load_reports: bool = True
    send_slo: bool = True
    by_size: bool = True

    def __post_init__(self) -> None:
        _check("min_limit", self.min_limit, 1, integer=True)
        _check("max_limit", self.max_limit, self.min_limit, integer=True)
        _check("initial_limit", self.initial_limit, self.min_limit, self.max_limit, integer=True)
        _check("target", self.target, 0.0, 1.0, open_low=True)
        _check("growth", self.growth, 0.0, open_low=True)
        _check("backoff", self.backoff, 0.0, 1.0, open_low=True)
        _check("max_waiting", self.max_waiting, 0, integer=True)
        _check("max_queue_wait", self.max_queue_wait, 0.0, 1.0)
        _check("reserve", self.reserve, 0.0, 0.9)
        _check("max_server_queue", self.max_server_queue, 0, integer=True)
        _check("signal_fresh_for", self.signal_fresh_for, 0.0, open_low=True)
        for name in ("ask_load_reports", "send_slo", "by_size"):
            _check_bool(name, getattr(self, name))
