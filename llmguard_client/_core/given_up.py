"""Calls the guard gave up on, remembered briefly: an SDK's retry of one fails at once with the same error.

The Stainless-built SDKs (openai, anthropic) retry whatever a transport raises, up to ``max_retries`` times,
and count their attempts in ``x-stainless-retry-count`` (0 on the first request, n on the n-th retry); a
framework above them may add its own. When the guard already spent every attempt it allows on a call, or
the call's deadline passed, a retry of it would start a whole new round of attempts (the guard's retries
multiplied by the SDK's). So the guard remembers each call it gave up on with an error, and a request that
is the same call again fails at once with that error, sending nothing.

The same call is recognised by its ``Idempotency-Key`` header when it has one (a retry keeps it), else by
its method, URL and body together with ``x-stainless-retry-count`` > 0 (a first request is never taken for
a retry), sent from the same task (async) or thread (sync) as the call: an SDK sends its retries from where
it sent the call, so another caller's request with the same body (the same prompt, or a control call beside
a guarded one) is never taken for one. The memory is bounded: at most `REMEMBERED` calls, each for `WINDOW`
seconds after the give-up (longer than an SDK's backoff between two retries: openai sleeps at most 8 s).

A call whose failure the guard hands back for the SDK to retry, as without a guard (the SDK's own read timeout
before the first token, an error the guard does not retry), is remembered too, as `HandedBack`: the rounds of
attempts the guard already made for it. The SDK's retry of it gets only the rounds its call has left, so the
SDK's ``max_retries`` adds no request to the guard's ``max_attempts``. A failure that comes when the call has no
round left is handed back only while every request of the call was the SDK's own (the guard retried or hedged
none: then the SDK's ``max_retries`` decides, as without a guard, one request per retry); once the guard's own
retries stood in for the SDK's, it is final instead (the transport's ``_give_up``).

A multipart upload the guard sends as it reads its files (`llmguard_client._http.upload.ReplayableBody`) is not
held, and the SDK draws a new multipart boundary each time it builds the request again: such a call is known
without its body, by its method, URL, caller, media type (``multipart/form-data``, its boundary left out) and
``Content-Length``. That cannot take another call for a retry: a request with a retry count > 0 comes from the
SDK's retry loop, in the task (or thread) that sent the call's earlier requests and has sent nothing else since
(it waits in that loop); and every first request of an upload (retry count 0) forgets what an earlier upload of
the same identity from that task left. So what such a retry finds was left by its own call. An upload sent with no
retry count (plain httpx, an SDK before it counted) is never taken for a retry: without its body, a first
request and a retry look the same. A body sent once as it comes (an iterator's) is not remembered at all: its one
attempt was the caller's one request, and the SDK's ``max_retries`` decides, as without a guard.

Older Stainless SDKs (openai before 1.47) send no ``x-stainless-retry-count``, so a retry looks like a first
request. A request from a Stainless SDK (`CallerHeaders.from_sdk`) that sends no retry count is taken for a retry
when it is the same call (method, URL, body) as one given up on at most `UNCOUNTED_WINDOW` seconds before: the
SDK's longest backoff and a second to spare. The price: the same request sent again as a new call within those
seconds, from such an SDK, fails at once too. Other SDKs' requests never are: most do not retry on their own
(mistralai, huggingface_hub, google-genai by default), and a repeat of theirs is the caller's, a new call.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace

import httpx

from llmguard_client._core.event_loops import running_task
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client.errors import GuardFailure
from llmguard_client.telemetry.record import PhaseRecord

logger = logging.getLogger("llmguard_client")

RETRY_COUNT_HEADER = "x-stainless-retry-count"
IDEMPOTENCY_HEADER = "idempotency-key"
REMEMBERED = 1024
"""At most this many calls are remembered (the oldest is forgotten first)."""
WINDOW = 30.0
"""Seconds after the give-up during which a retry of the call fails at once."""
UNCOUNTED_WINDOW = 9.0
"""Seconds after the give-up during which a Stainless SDK's request without a retry count is taken for a retry
of the same call (openai sleeps at most 8 s between two of its requests)."""
CALLER_EXTENSION = "llmguard_caller"
"""Set by the sync edges to their caller's thread: a sync call runs in a task of the Guard's loop, not the caller's."""


def from_sync_edge(request: httpx.Request) -> bool:
    """Whether a sync edge sends ``request`` (`CALLER_EXTENSION`), which sends it again where the Guard runs if the
    loop it was to run on is gone (`LoopEnded`)."""
    return CALLER_EXTENSION in request.extensions


_CHAIN_DEPTH = 8
"""How deep a remembered error's chain of causes is kept (an httpx error wraps httpcore's, which wraps the
socket's: 3 or 4 deep)."""


@dataclass(frozen=True, slots=True)
class Episode:
    """A call in cooperative mode (`RetryPolicy.mode`) between two of the SDK's requests: the guard allowed
    a retry, and what must hold across the requests (the deadlines, the attempts used, the replicas that
    failed it) waits here for the SDK's next one. ``error`` or ``answer`` is what the last request got, handed
    back again if the next one may not be sent after all (e.g. the budget emptied meanwhile); an answer's body is
    None when it was longer than the guard keeps (`llmguard_client._http.error_body`)."""

    first_token_deadline: float
    total_deadline: float
    rounds: int
    failed: tuple[ReplicaState, ...]
    """The replica of each failed attempt of the call so far, once per failure (`Route.earlier_failures`)."""
    paced: bool = False
    """The retry allowed waits out the server's Retry-After (`Payment.paced`): it may pass the budget's bound."""
    error: GuardFailure | None = None
    answer: tuple[int, list[tuple[bytes, bytes]], bytes | None] | None = None
    record: PhaseRecord | None = None


@dataclass(frozen=True, slots=True)
class HandedBack:
    """A call whose failure the guard handed back for the SDK to retry as without a guard, after ``rounds`` rounds
    of attempts of its own (the call's earlier requests' included): they count among the retry's (`Route.spent`)."""

    rounds: int
    retried: bool = False
    """The guard sent more than one request for one of the call's requests (a retry or a hedge of its own)."""


Remembered = GuardFailure | Episode | HandedBack
"""A call given up on (its error), one the SDK is expected to retry (its `Episode`), or one handed back to the SDK
after rounds of the guard's own (`HandedBack`)."""


def retry_count(request: httpx.Request) -> int:
    """The SDK's ``x-stainless-retry-count`` (0 when absent or not a number)."""
    value = request.headers.get(RETRY_COUNT_HEADER)
    return int(value) if value is not None and value.isdigit() else 0


class GivenUp:
    """The calls the guard gave up on in the last `WINDOW` seconds, by identity (see the module doc)."""

    def __init__(self, size: int = REMEMBERED, window: float = WINDOW) -> None:
        self._size = size
        self._window = window
        self._calls: OrderedDict[str, tuple[float, Remembered]] = OrderedDict()
        """By identity: (when it was given up on or handed back, what is remembered), oldest first."""

    def __len__(self) -> int:
        return len(self._calls)

    def remember(self, request: httpx.Request, body: bytes | None, what: Remembered, now: float) -> None:
        """The guard gave up on this call with an error (raised to the caller), or expects the SDK to retry
        it (an `Episode`, cooperative mode; a `HandedBack`). ``body``: the call's body, None for an upload the
        guard sends as it is read (known without it)."""
        key = _identity(request, body)
        if isinstance(what, GuardFailure):
            what = kept(what)
        elif isinstance(what, Episode) and what.error is not None:
            what = replace(what, error=kept(what.error))
        self._calls[key] = (now, what)
        self._calls.move_to_end(key)
        while len(self._calls) > self._size:
            self._calls.popitem(last=False)

    def forget(self, request: httpx.Request, body: bytes | None) -> None:
        """This call (or another with the same identity) failed in a way its SDK may retry: forget what an
        earlier call of the same identity left, so that retry is not answered with the other call's error."""
        self._calls.pop(_identity(request, body), None)

    async def recall(self, request: httpx.Request, now: float, held: bool, sdk: bool) -> Remembered | None:
        """For a retry of a call remembered within the window: a fresh copy of its error if the guard gave
        up on it, or its `Episode` or `HandedBack` (then forgotten: the retry carries it on); None for a request
        that is not such a retry (the cheap answer while nothing is remembered). ``held``: the request's body is
        in memory; else it is an upload the guard sends as it is read, known without its body (never read here).
        ``sdk``: the request comes from a Stainless SDK (`CallerHeaders.from_sdk`), which may retry it uncounted."""
        if not self._calls:
            return None
        self._expire(now)
        headers = request.headers
        count = retry_count(request)
        uncounted = RETRY_COUNT_HEADER not in headers
        keyed = IDEMPOTENCY_HEADER in headers and uncounted
        legacy = held and uncounted and not keyed and sdk
        if not self._calls or not (count > 0 or keyed or legacy):  # an SDK's first request is never a retry
            if not held and not uncounted and self._calls:  # a new upload: not answered for an earlier one
                self._calls.pop(_identity(request, None), None)
            return None
        key = _identity(request, await request.aread() if held else None)
        entry = self._calls.get(key)
        if entry is None or (legacy and now - entry[0] > UNCOUNTED_WINDOW):
            return None
        what = entry[1]
        if isinstance(what, GuardFailure):
            return again(what, request, count)
        del self._calls[key]
        return what

    def _expire(self, now: float) -> None:
        calls = self._calls
        while calls:
            key, (since, _) = next(iter(calls.items()))
            if since + self._window > now:
                return
            del calls[key]


SdkCall = tuple[str | None, int]
"""The SDK call a request is a request of (`sdk_call`): its id (None: no SDK that counts its retries) and the
request's retry count."""


async def sdk_call(request: httpx.Request, held: bool) -> SdkCall:
    """The SDK call ``request`` belongs to, for its cohort and its record: an id its retries share (a 64-bit hash of
    the identity the memory uses, so that calls whose ``Idempotency-Key`` values share a long prefix differ) and its
    retry count; ``(None, 0)`` for a request sent by no SDK that counts its retries. ``held``: the body is read whole
    (else it is an upload the guard sends as it is read, known without its body, never read here)."""
    if RETRY_COUNT_HEADER not in request.headers:
        return None, 0
    body = await request.aread() if held else None
    digest = hashlib.blake2b(_identity(request, body).encode(), digest_size=8).hexdigest()
    return digest, retry_count(request)


def _identity(request: httpx.Request, body: bytes | None) -> str:
    """The call ``request`` is a request of: its ``Idempotency-Key``, else its method, URL, caller and body (for a
    body not held, ``body`` None: its media type without the boundary, and its length; see the module doc)."""
    key: str | None = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None:
        return "key:" + key
    kind, headers = "hash:", request.headers
    if body is None:
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        kind, body = "upload:", media.encode() + b"\0" + headers.get("content-length", "").encode()
    digest = hashlib.sha256(body)
    digest.update(b"\0" + request.method.encode() + b"\0" + str(request.url).encode())
    digest.update(b"\0" + _caller(request).encode())
    return kind + digest.hexdigest()


def _caller(request: httpx.Request) -> str:
    """Where ``request`` was sent from: the thread a sync edge named, else the running task. An SDK sends a
    call's retries from where it sent the call; another caller's request with the same body is another call."""
    caller = request.extensions.get(CALLER_EXTENSION)
    if caller is not None:
        return str(caller)
    task = running_task()
    if task is None:  # the memory used directly, outside a task
        return ""
    mark = _task_marks.get(task)  # a number for the task's life: a later task at the same address is another
    if mark is None:
        mark = _task_marks[task] = next(_mark_counter)
    return f"task:{os.getpid()}:{mark}"  # the process too: a record's id is compared across processes


_task_marks: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
_mark_counter = itertools.count()


def kept(error: GuardFailure) -> GuardFailure:
    """What is remembered of ``error``: a copy that holds no request and no traceback. The raised error's
    traceback keeps the call's frames alive, and its request (and its cause's) the request body: a thousand
    remembered calls with large prompts would otherwise hold gigabytes for the `WINDOW`."""
    return _copy(error, error.message, None, _detached(error.__cause__))


def _detached(error: BaseException | None, depth: int = 0) -> BaseException | None:
    """A copy of the attempt's error ``error`` (its type and message, and those of the errors it wraps: what the
    caller reads in the chain, such as the ``[Errno 111]`` an SDK names as the reason) that holds no request and
    no traceback."""
    if error is None or depth > _CHAIN_DEPTH:
        return None
    args = tuple(_detached_arg(arg, depth) for arg in error.args)
    try:
        copy = type(error)(*args)
    except Exception:  # a constructor of its own: the message is what is kept
        copy = RuntimeError(f"{type(error).__name__}: {error}")
    copy.__cause__ = _detached(error.__cause__, depth + 1)
    return copy


def _detached_arg(arg: object, depth: int) -> object:
    """An argument of an error, with any error in it (httpcore wraps its cause as an argument; an exception
    group holds a list of them) detached too."""
    if isinstance(arg, BaseException):
        return _detached(arg, depth + 1)
    if isinstance(arg, (list, tuple)) and any(isinstance(item, BaseException) for item in arg):
        return type(arg)(_detached_arg(item, depth) for item in arg)
    return arg


def again(error: GuardFailure, request: httpx.Request, count: int) -> GuardFailure:
    """The same failure for the retry (a new exception: each raise gets its own traceback)."""
    retry = f"retry {count} of " if count else "a retry of "
    message = f"{retry}a call the guard already gave up on, failed at once (nothing sent): {error.message}"
    return _copy(error, message, request, error.__cause__)


def _copy(
    error: GuardFailure, message: str, request: httpx.Request | None, cause: BaseException | None
) -> GuardFailure:
    """A new ``error``: the same type, record, retry-after and cause string, with ``message``, ``request`` and
    ``cause`` as its ``__cause__``."""
    fresh = type(error)(message, request=request, record=error.record, retry_after=error.retry_after)
    fresh.cause, fresh.final = error.cause, error.final
    fresh.__cause__ = cause
    return fresh
