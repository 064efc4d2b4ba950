"""Cooperative retries (`RetryPolicy.mode` ``"cooperative"``): the SDK sends the retries the guard allows.

Each SDK request gets one attempt round (the guard's hedges included). When it fails and the retry layer
would retry (`Failed.stopped` ``"sdk"``: retryable, attempts left, the budget has room, it fits the
deadline), the caller gets the failure itself with ``x-should-retry: true`` and ``retry-after-ms`` (the
backoff or Retry-After the guard would have waited) on a server's answer, or the raised error (a timeout,
a connection error: the SDK retries those on its own); the call's `Episode` is remembered. The SDK's next
request of the same call (`llmguard_client._core.given_up`) resumes it: the first episode's deadlines, the
attempts it used, a replica that has not failed it, paid from the retry budget like any retry. When the
guard would not retry, the failure is final (``x-should-retry: false``), as in the default mode.

How many requests a call gets (`sdk_rounds`): the SDK's own ``max_retries`` is the caller's intent, so the
retry policy's ``max_attempts`` (a guard-wide default) does not cap the SDK's requests; the budget, the
deadlines and Retry-After still decide each one. An explicit cap still holds: the call's
``x-llmguard-max-attempts`` header or its tier's ``max_attempts``; without one, `MAX_ATTEMPTS` (the most any
setting allows) bounds a call whatever the SDK asks.
"""

from __future__ import annotations

import math

import httpx

from llmguard_client._core.call import Call
from llmguard_client._core.given_up import Episode
from llmguard_client._core.outcome import Failed, Route
from llmguard_client._routing.caller import calling_as
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_client.config import MAX_ATTEMPTS


def sdk_rounds(call: Call) -> int:
    """The most attempt rounds a call from a retrying SDK may use across its requests: the call's
    ``x-llmguard-max-attempts`` or its tier's ``max_attempts``, else `MAX_ATTEMPTS` (the SDK's own
    ``max_retries`` decides below it; the retry policy's ``max_attempts`` does not apply)."""
    return call.max_attempts or MAX_ATTEMPTS


def resume(call: Call, episode: Episode, replicas: ReplicaSet) -> Route | None:
    """The route of the SDK's retry of ``episode``'s call: its deadlines, the attempts left, a replica that has
    not failed it when one is ready (else the retry layer's choice, as for a retry in the default mode), paid
    from the budget, with the call's earlier failures (`Route.earlier_failures`: its wait before going back to a
    replica grows with them, as the default mode's does); None when the budget refuses (nothing is sent)."""
    call.first_token_deadline = episode.first_token_deadline
    call.total_deadline = episode.total_deadline
    payment = call.pay_extra(paced=episode.paced)
    if payment is None:
        return None
    now, key = call.clock(), call.affinity_key
    avoid = call.outside
    failed = (*episode.failed, *avoid)
    with calling_as(call.scope):  # another limit's 429s do not hold it back
        replica = replicas.pick_ready(now, failed, key) or replicas.pick(
            now, failed, key, cornered=bool(avoid), keep=call.lease.hold
        )
    return Route(
        replica,
        "retry",
        payment,
        avoid=avoid,
        rounds=sdk_rounds(call),
        spent=episode.rounds,
        earlier_failures=episode.failed,
    )


def next_episode(call: Call, outcome: Failed, before: Episode | None) -> Episode:
    """What holds across the SDK's next request, after this request's round failed with ``outcome``."""
    failed = (*(before.failed if before is not None else ()), *(f.state for f in outcome.failures))
    return Episode(
        first_token_deadline=call.first_token_deadline,
        total_deadline=call.total_deadline,
        rounds=(before.rounds if before is not None else 0) + 1,
        failed=failed,
        paced=outcome.paced,
    )


def allow_retry(response: httpx.Response, seconds: float) -> None:
    """Tell the SDK to retry after ``seconds`` (at least 1 ms: the SDKs ignore a Retry-After of 0)."""
    response.headers["x-should-retry"] = "true"
    response.headers["retry-after-ms"] = str(max(1, round(seconds * 1000)))
    response.headers["retry-after"] = str(max(1, math.ceil(seconds)))
