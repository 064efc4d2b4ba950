"""Per-tier bulkhead: bounded calls in flight, a bounded waiting line, fast failure past both.

The wait for a slot counts against the call's first-token deadline. A slot, once taken, is
held by the call's lease until the call ends (for a stream: until its body is done).
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio

from llmguard_client._core.call import Call
from llmguard_client._core.outcome import Failed, Outcome, Route
from llmguard_client._core.pipeline import Next
from llmguard_client._layers.deadline import ttft_timeout
from llmguard_client.config import Bulkhead
from llmguard_client.errors import BulkheadFull
from llmguard_client.telemetry.hooks import Instrumentation


class TierBulkhead:
    """Slots for one tier's calls."""

    def __init__(self, config: Bulkhead) -> None:
        self.config = config
        self._slots = anyio.Semaphore(config.max_in_flight)
        self.waiting = 0
        self.rejected = 0

    @property
    def in_flight(self) -> int:
        return self.config.max_in_flight - self._slots.value

    async def acquire(self) -> bool:
        """Take a slot, waiting in line if the line has room; False (at once) if it has none."""
        taken = self.try_acquire()
        return taken if taken is not None else await self.wait()

    def try_acquire(self) -> bool | None:
        """A free slot, taken without yielding (True, never counted as waiting); False if there is none
        and the line is full (counted as rejected); None if the caller may `wait` in line."""
        try:
            self._slots.acquire_nowait()
            return True
        except anyio.WouldBlock:
            pass
        if self.waiting >= self.config.max_waiting:
            self.rejected += 1
            return False
        return None

    async def wait(self) -> bool:
        """Wait in line for a slot (after `try_acquire` said None); True once it is taken."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        return True

    def release(self) -> None:
        self._slots.release()


class BulkheadLayer:
    """Admits a guarded call into its tier's bulkhead (if the tier has one): at once, or after a wait in line no
    longer than its first-token deadline and its caller's pool timeout."""

    def __init__(self, bulkheads: Mapping[str, TierBulkhead], instrumentation: Instrumentation) -> None:
        self.bulkheads = dict(bulkheads)
        self._instrumentation = instrumentation

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        bulkhead = self.bulkheads.get(call.tier_name)
        if bulkhead is not None:
            admitted = bulkhead.try_acquire()
            if admitted is None:  # only a wait in line needs a cancel scope (and its timer)
                held = call.clock() + call.pool_wait  # at most the caller's pool timeout
                with call.phase_until(min(call.first_token_deadline, held)):  # Guard.aclose() ends it too
                    admitted = await bulkhead.wait()
                if admitted is None and held < call.first_token_deadline:
                    return Failed(
                        reason=self._full(call, bulkhead, f"after the {call.pool_wait:g}s of its pool timeout")
                    )
                if admitted is None:
                    return Failed(reason=ttft_timeout(call, "while waiting for a bulkhead slot"))
            if not admitted:
                return Failed(reason=self._full(call, bulkhead, "at once"))
            call.lease.hold(bulkhead.release)
        call.record.queued_until(call.clock())
        return await call_next(call, route)

    def _full(self, call: Call, bulkhead: TierBulkhead, when: str) -> BulkheadFull:
        self._instrumentation.bulkhead_rejected(call.tier_name)
        return BulkheadFull(
            f"tier {call.tier_name!r} already has {bulkhead.config.max_in_flight} call(s) in flight and "
            f"{bulkhead.config.max_waiting} waiting (its Bulkhead limits); the call was refused {when}",
            request=call.request,
            record=call.record,
        )
