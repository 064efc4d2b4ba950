"""The layer protocol and the composition of a pipeline.

Every layer is an object with one method::

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome

It may act before and after ``call_next``, call it several times (retry), concurrently
(hedge), or not at all (a bulkhead that refuses). The innermost handler (the attempt)
takes ``(call, route)`` only. `GuardTransport` declares the order once.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from llmguard_client._core.call import Call
from llmguard_client._core.outcome import Outcome, Route

Next = Callable[[Call, Route], Awaitable[Outcome]]


class Layer(Protocol):
    """One resilience concern, wrapped around the rest of the pipeline."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome: ...


def compose(layers: Sequence[Layer], innermost: Next) -> Next:
    """``layers[0]`` outermost, ``innermost`` last: one handler for the whole pipeline.

    Each layer is bound to the rest with `functools.partial`, not a wrapping coroutine: a call
    then runs through one frame per layer, and every resumption of a waiting attempt passes
    through that many frames, not twice as many."""
    handler = innermost
    for layer in reversed(layers):
        handler = functools.partial(layer.__call__, call_next=handler)
    return handler
