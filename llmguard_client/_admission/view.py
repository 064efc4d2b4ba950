"""`AdmissionSnapshot`: what ``guard.snapshot().admission`` shows of one replica (exported by
`llmguard_client.snapshot`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AdmissionSnapshot"]


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """One replica's adaptive admission (`Admission`): its learned limit, slots, line and load signal."""

    limit: int
    """Attempts the guard lets in flight on the replica now (learned), in calls of an average size when
    `Admission.by_size` weighs them."""
    in_flight: int
    waiting: int
    """Calls in line for a slot."""
    refused: int
    """Calls refused with `Overloaded` so far."""
    slots_freed_per_s: float
    """Slots freed per second lately (in calls of an average size when calls are weighed)."""
    ttft_floor: float | None
    """The fastest first token seen (the replica unloaded), seconds."""
    ttft_recent: float | None
    """Recent first tokens (an EWMA), seconds after the attempt was sent."""
    server_waiting: float | None
    """The waiting queue the replica itself reported (ORCA header, or `/metrics` polled), if fresh; else None."""
    server_kv_usage: float | None
    signal_age: float
    """Seconds since the replica's last own report (inf: never)."""
