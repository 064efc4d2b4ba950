"""`StreamStages`: the stages a guarded stream runs after its first token, declared once per Guard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmguard_client._stream.continuation import Continuer
from llmguard_client._stream.watchdog import ReadWatchdog

if TYPE_CHECKING:
    import httpx

    from llmguard_client._core.clock import TimeSource


class Watch(Protocol):
    """Bounds the reads of a live stream by ``stall`` and ``total_at`` with a watchdog over ``response``'s
    socket; None where the body must bound each read with a cancel scope instead."""

    def __call__(
        self, response: httpx.Response, stall: float, total_at: float, time_source: TimeSource
    ) -> ReadWatchdog | None: ...


@dataclass(frozen=True, slots=True)
class StreamStages:
    """The stages after the first token, in the order a chunk meets them (`llmguard_client._stream.body`):

    1. ``deadlines``: the tier's stall and total limits on every read (``watch``: a read watchdog, or a
       cancel scope per read where it returns None);
    2. the protocol reader: the winner's own (`Win.reader`, chosen by the attempt), fed every chunk;
       an in-stream error or an EOF before the end marker is a break;
    3. ``continuation``: a break handed to the call's continuation (None: no tier has one), which sends a
       continuation route through `Pipeline.continuation`.
    """

    watch: Watch
    continuation: Continuer | None = None
    """Mid-stream failover (`llmguard_client._stream.continuation`), or None."""
