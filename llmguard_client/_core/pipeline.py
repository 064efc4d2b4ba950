"""The layer protocol, the composition of layers, and the `Pipeline` that declares them before the first token.

Every layer is an object with one method::

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome

It may act before and after ``call_next``, call it several times (retry), concurrently
(hedge), or not at all (a bulkhead that refuses). The innermost handler (the attempt)
takes ``(call, route)`` only. The composition root (`llmguard_client._compose.build_pipeline`) declares the
order once, in a `Pipeline`, beside the stream stages that run after the first token
(`llmguard_client._stream.stages.StreamStages`).
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


class Pipeline:
    """A guarded call's path before its first token, declared once: the layers (outermost first) and the
    innermost attempt; the layers a continuation route goes through (a subset of the same layer objects: no
    second copy of any of them).

    ``handle`` runs a call's first route; ``continuation`` runs a continuation route (kind
    ``continuation``) through its layers and the same attempt."""

    __slots__ = ("attempt", "continuation", "continuation_layers", "handle", "layers")

    def __init__(self, layers: Sequence[Layer], attempt: Next, continuation_layers: Sequence[Layer]) -> None:
        missing = [layer for layer in continuation_layers if layer not in layers]
        if missing:
            raise ValueError(f"continuation layers must be layers of the pipeline; not in it: {missing!r}")
        self.layers = tuple(layers)
        self.attempt = attempt
        self.continuation_layers = tuple(continuation_layers)
        self.handle: Next = compose(self.layers, attempt)
        self.continuation: Next = compose(self.continuation_layers, attempt)
