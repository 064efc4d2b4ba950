"""Optional server hints: a vLLM server's own queue length and KV-cache use, from its ``/metrics``.

Without this the guard learns each replica's load from its own calls only. Several clients sharing
the replicas each see only their own calls in flight; vLLM's Prometheus endpoint reports what every
client put there::

    vllm:num_requests_waiting{model_name="..."} 3.0       requests queued, not yet scheduled
    vllm:kv_cache_usage_perc{model_name="..."} 0.42       (vLLM >= 0.10; older: vllm:gpu_cache_usage_perc)

`poll_vllm_metrics` reads them at a bounded rate and hands them to the router: a replica whose server
reports a queue ranks after those that report none (a new call would wait behind it; where every server
queues, the queued requests count as load beside the guard's own calls in flight; a call already waiting
behind a queue of 4 or more there is hedged at once), and a KV cache at 95 % or more ranks the replica with
those that have no room. It is a coroutine *you* run in a task group you own, so nothing runs behind your
back; cancelling the group stops it, and it returns once the Guard's close begins (nothing is sent after)::

    async with anyio.create_task_group() as tg:
        tg.start_soon(poll_vllm_metrics, guard)  # about every 0.1 s
        ...  # use the guard
        tg.cancel_scope.cancel()

Sync code (the Guard's sync clients, e.g. ``openai.OpenAI``) runs it with `vllm_metrics_polled`, a context
manager that polls on the loop thread those clients share, and stops the poller before it returns::

    with vllm_metrics_polled(guard):
        ...  # calls through guard.sync_http_client()

Each replica's metrics URL is its base URL with a trailing ``/v1`` removed, plus ``/metrics``
(``http://host:8000/v1`` -> ``http://host:8000/metrics``). A replica that answers 404 is not polled
again; any other failure or an unreadable body just leaves that replica without a hint until the
next round. The default rate, about ten polls a second, is what a queue that builds and drains
within a second needs: a call can enter it unseen for at most about 0.1 s (polled every 0.5 s or more,
most such queues are seen late or not at all); ``every=0.2`` halves the cost and doubles that time. Each interval is
drawn within 10 % of ``every``, so that processes polling together drift apart and no period locks onto a
periodic load. Guards sharing a ``fleet=`` take turns: one process polls and publishes what each server
said, the others poll nothing and believe it, so a fleet costs each server what one process does (if that
process stops, another takes over within three intervals). Processes without a fleet each poll on their
own: in a large deployment without one, raise ``every``.
A hint is believed for three polling intervals, on the Guard's clock (the one its router
reads: the event loop's by default, ``Guard(clock=...)`` if injected), so hints steer under trio and in
virtual time too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import anyio
import httpx

from llmguard_client._core.clock import Clock, current_time_source, loop_clock, raise_bare
from llmguard_client._core.lease import close_quietly
from llmguard_client._core.loop_owner import FORKED
from llmguard_client._core.randomness import jitter
from llmguard_client._http.pool import DROPPABLE
from llmguard_client._http.urlpath import sent_path, with_sent_path
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState  # at run time: for get_type_hints
from llmguard_client.edges._registry import sync_access
from llmguard_client.edges._runner import start_counted, wait_for
from llmguard_client.errors import GuardClosed, GuardConfigError, WrongEventLoop
from llmguard_client.guard import Guard

if sys.version_info < (3, 11):  # anyio brings the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "MIN_EVERY",
    "ServerLoad",
    "metrics_url",
    "parse_vllm_metrics",
    "poll_once",
    "poll_vllm_metrics",
    "vllm_metrics_polled",
]

logger = logging.getLogger("llmguard_client")

WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
BODY_LIMIT = 1024 * 1024
"""Bytes of a /metrics answer read at most."""
MIN_EVERY = 0.1
"""The shortest ``every`` accepted, in seconds."""
JITTER = 0.1
"""Each interval is ``every`` times a factor drawn from [1 - JITTER, 1 + JITTER]."""


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What one ``/metrics`` answer said (None: the metric was absent)."""

    waiting: float | None
    kv_usage: float | None


def parse_vllm_metrics(text: str) -> ServerLoad:
    """Queued requests (summed over label sets) and KV-cache use (the highest, 0-1) from Prometheus text."""
    waiting: float | None = None
    kv: float | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in WAITING and name not in KV_USAGE:
            continue
        rest = line.rsplit("}", 1)[1] if "{" in line else line[len(name) :]  # "name{labels} value [time]"
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if not math.isfinite(value) or value < 0:
            continue
        if name in WAITING:
            waiting = value if waiting is None else waiting + value
        else:
            kv = value if kv is None else max(kv, value)
    return ServerLoad(waiting, kv)


def metrics_url(base: httpx.URL) -> httpx.URL:
    """``/metrics`` next to the OpenAI API: a trailing ``/v1`` of the replica's base is dropped (its path as sent,
    percent-escapes kept)."""
    path = sent_path(base).rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return with_sent_path(base, path + "/metrics")


async def poll_once(
    guard: Guard, *, request_timeout: float = 1.0, fresh_for: float = 6.0, clock: Clock | None = None
) -> dict[str, ServerLoad | None]:
    """Read every replica's ``/metrics`` once, at the same time (each within ``request_timeout`` s), and hand
    what they say to the Guard's router, where it counts for ``fresh_for`` seconds, stamped with ``clock`` (by
    default the Guard's own); returns the hint per replica name (None: no hint). Run it on the event loop that
    makes the Guard's calls; the fleet's processes are not told (`poll_vllm_metrics` shares its polls).
    `GuardClosed` on a closed Guard, one whose close began while it polled (its polls cancelled), or one used in
    the parent of this forked process."""
    if request_timeout <= 0 or fresh_for <= 0:
        raise GuardConfigError(
            f"poll_once needs request_timeout > 0 and fresh_for > 0 (seconds), got {request_timeout!r}, {fresh_for!r}"
        )
    registry = guard._registry
    if registry.closed:
        raise GuardClosed(CLOSED)
    loops = guard.transport.loops
    if loops.forked:
        raise GuardClosed(FORKED)
    refused = None if loops.owns() else await loops.claim()
    if refused is not None:
        raise WrongEventLoop(refused)
    now = current_time_source(clock if clock is not None else guard._clock).now
    hints: dict[str, ServerLoad | None] = {}
    with registry.beside():  # ended by the Guard's close
        hints = await _poll_round(
            guard._replica_set,
            request_timeout=request_timeout,
            fresh_for=fresh_for,
            clock=now,
            usable=functools.partial(_usable, guard),
        )
    if registry.closed:
        raise GuardClosed(CLOSED)
    return hints


CLOSED = "this Guard is closed: its replicas are not polled; build a new Guard"
"""Why `poll_once` raises `GuardClosed` for a Guard closed before or while it polls."""


def _usable(guard: Guard) -> bool:
    """Whether the Guard's connections may be used from here now: it is open and this loop owns it."""
    return not guard._registry.closed and guard.transport.loops.owns()


async def _poll_round(
    replicas: ReplicaSet,
    *,
    request_timeout: float,
    fresh_for: float,
    clock: Clock = loop_clock,
    skip: set[str] | None = None,
    usable: Callable[[], bool] | None = None,
) -> dict[str, ServerLoad | None]:
    """One round of polls: every replica's ``/metrics`` at once, what they say handed to the router stamped with
    ``clock``. Names in ``skip`` are not polled; a replica that answers 404 is added to it. ``usable``: whether the
    replicas' connections may be used from here, asked right before each request (the Guard may have closed since
    the round began, or a sync call on this loop's thread moved them to another loop); no request without."""
    skip = skip if skip is not None else set()
    out: dict[str, ServerLoad | None] = {}

    async def one(state: ReplicaState) -> None:
        if usable is not None and not usable():  # no await from here to the pool: still true as the request leaves
            out[state.name] = None
            return
        load = await _fetch(state, request_timeout, skip)
        out[state.name] = load
        if load is not None:
            replicas.router.server_load(
                state, clock(), waiting=load.waiting, kv_usage=load.kv_usage, fresh_for=fresh_for
            )

    try:
        async with anyio.create_task_group() as tg:
            for state in replicas.states:
                if state.name not in skip:
                    tg.start_soon(one, state)
    except BaseExceptionGroup as group:  # e.g. Ctrl-C, which trio delivers to any task: raised as it came
        raise_bare(group)
    return out


async def poll_vllm_metrics(
    guard: Guard,
    *,
    every: float = 0.1,
    request_timeout: float | None = None,
    clock: Clock | None = None,
) -> None:
    """Poll every replica's ``/metrics`` about once per ``every`` seconds (at least 0.1; each interval within
    10 % of it) until cancelled or the Guard closes, each request bounded by ``request_timeout`` (default: 1 s or
    ``every`` if shorter). Hints are stamped with ``clock``, by default the Guard's own (what its router reads them
    against). Once ``guard.aclose()`` begins it returns (quietly, its polls in flight cancelled), and on a closed
    Guard it returns at once: nothing is sent after the close began."""
    request_timeout = _checked(every, request_timeout)
    replicas = guard._replica_set
    registry = guard._registry
    time_source = current_time_source(clock if clock is not None else guard._clock)
    now = time_source.now
    shared = guard._fleet.hints if guard._fleet is not None else None
    loops = guard.transport.loops
    fresh_for = 3 * every
    skip: set[str] = set()
    try:
        with registry.beside():  # the Guard's close cancels it, wherever it waits: it ends quietly
            while not registry.closed and len(skip) < len(replicas.states):
                started = now()
                # The replicas' connections are the loop's that owns the Guard: polled from there only (a notebook's
                # sync cell may have moved the Guard to its own thread meanwhile; the next round takes it back).
                ours = loops.owns() or await loops.claim() is None
                if ours and (shared is None or await shared.lead(hold_for=fresh_for)):
                    loads = await _poll_round(
                        replicas,
                        request_timeout=request_timeout,
                        fresh_for=fresh_for,
                        skip=skip,
                        clock=now,
                        usable=functools.partial(_usable, guard),
                    )
                    if shared is not None:
                        shared.publish(
                            {n: (x.waiting, x.kv_usage) for n, x in loads.items() if x is not None}, fresh_for
                        )
                await time_source.sleep_until(started + every * jitter(1.0 - JITTER, 1.0 + JITTER))
    finally:
        if shared is not None:
            shared.release()
    if registry.closed:
        logger.debug("llmguard: the Guard is closed; server hints stop")
    else:
        logger.info("llmguard: no replica serves /metrics; server hints stop")


@contextlib.contextmanager
def vllm_metrics_polled(guard: Guard, *, every: float = 0.1, request_timeout: float | None = None) -> Iterator[None]:
    """`poll_vllm_metrics` for sync code: polls where the Guard's sync calls run (its own event-loop thread, or the
    running loop of async code that owns the Guard) while the block runs, and has stopped when it exits. On the
    Guard's own thread it does not keep the Guard there: async code that takes the Guard over meanwhile is not kept
    waiting, and the poller skips its rounds until the Guard is back. The arguments are checked before anything
    starts."""
    _checked(every, request_timeout)
    if asyncio._get_running_loop() is not None:  # the poller would write the router's state from another thread
        raise GuardConfigError(
            "vllm_metrics_polled is for sync code; in async code run poll_vllm_metrics(guard) in a task group"
        )
    poller = _Poller(functools.partial(poll_vllm_metrics, guard, every=every, request_timeout=request_timeout))
    access, _ = sync_access(guard, holds=False)  # where the sync calls run: the poller uses the same connections
    polling = start_counted(access, poller.run, None)
    try:
        yield
    finally:
        with contextlib.suppress(GuardClosed):  # closed meanwhile: the poller was cancelled with the loop
            access.call(poller.stop)
        if access.loop is not None:
            with contextlib.suppress(GuardClosed):  # its loop ended (cancelling it) or closed
                wait_for(polling, access.loop)


class _Poller:
    """One poller task on the Guard's loop that `stop` ends, whether it has started yet or not."""

    def __init__(self, poll: Callable[[], Awaitable[None]]) -> None:
        self._poll = poll
        self._scope: anyio.CancelScope | None = None
        self._stopped = False

    async def run(self) -> None:
        with anyio.CancelScope() as self._scope:
            if self._stopped:
                return
            await self._poll()

    async def stop(self) -> None:
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()


def _checked(every: float, request_timeout: float | None) -> float:
    """``request_timeout`` (its default if None) once both values are valid, else `GuardConfigError`."""
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every >= MIN_EVERY:
        raise GuardConfigError(f"poll_vllm_metrics: every must be at least {MIN_EVERY} seconds, got {every!r}")
    if request_timeout is None:
        request_timeout = min(1.0, every)
    if (
        isinstance(request_timeout, bool)
        or not isinstance(request_timeout, (int, float))
        or not 0 < request_timeout <= every
    ):
        raise GuardConfigError(
            f"poll_vllm_metrics: request_timeout must be > 0 and <= every ({every}), got {request_timeout!r}"
        )
    return float(request_timeout)


async def _fetch(state: ReplicaState, request_timeout: float, skip: set[str]) -> ServerLoad | None:
    request = httpx.Request("GET", metrics_url(state.base), headers=state.own_headers, extensions={DROPPABLE: True})
    response: httpx.Response | None = None
    with anyio.move_on_after(request_timeout):
        try:
            response = await state.transport.handle_async_request(request)
            if response.status_code == 404:
                skip.add(state.name)
                logger.info("llmguard: %s has no /metrics (404); not polled again", state.name)
                return None
            if response.status_code != 200:
                return None
            body = await _read(response)
            return parse_vllm_metrics(body.decode("utf-8", "replace"))
        except (httpx.HTTPError, OSError) as exc:
            logger.debug("llmguard: /metrics of %s failed: %r", state.name, exc)
            return None
        finally:
            if response is not None:
                await close_quietly(response)
    return None


async def _read(response: httpx.Response) -> bytes:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    parts: list[bytes] = []
    size = 0
    async for chunk in stream:
        parts.append(chunk)
        size += len(chunk)
        if size >= BODY_LIMIT:
            break
    return b"".join(parts)
