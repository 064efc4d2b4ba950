"""Time-to-first-token statistics, kept per replica, tier and stream kind; the hedge delay comes from them.

The `Guard` builds one `TTFTStats` and hands it to the layers that read it: the hedge layer (how long
to wait before hedging, and whether a fresh attempt can still make the deadline) and the retry layer
(whether a retry's first token can). The transport feeds it the winning attempt of every guarded call.

The rule for the adaptive hedge delay (``HedgePolicy.delay=None``), per tier and stream kind:

1. each replica keeps a window of its own recent TTFTs (the last `TTFTStats.WINDOW`);
2. replicas the router has drained as degraded are left out, and so are replicas with fewer than
   `TTFTStats.MIN_REPLICA_SAMPLES` samples (if that leaves none, every replica with enough samples
   counts);
3. the delay is the lower median, over the replicas that count, of each one's ``HedgePolicy.quantile``
   (p95 by default), clamped to [``min_delay``, ``max_delay``]; until the class has ``min_samples``
   samples in all, it is ``warmup_delay``.

A slow minority of replicas therefore cannot drag the delay up: with three replicas, one of them 10x
slower moves the median of the three p95s not at all, even before the router drains it. A quantile of
all TTFTs pooled together, by contrast, learns the slow replica's TTFT as soon as it holds more than
5 % of the samples, and the hedge then fires too late to help.
"""

from __future__ import annotations

from collections.abc import Callable

from llmguard_client._config import HedgePolicy
from llmguard_client._quantile import StreamingQuantile

__all__ = ["TTFTStats"]

_Class = tuple[str, bool]


def _never_degraded(name: str) -> bool:
    return False


class TTFTStats:
    """Per-replica TTFT windows for each (tier, stream) class, and the estimates read from them."""

    WINDOW = 128
    MIN_REPLICA_SAMPLES = 5

    def __init__(self, policy: HedgePolicy, degraded: Callable[[str], bool] = _never_degraded) -> None:
        """``policy`` gives the quantile, the clamps and the warm-up; ``degraded(replica)`` tells which
        replicas to leave out (the router's drained ones)."""
        self._policy = policy
        self._degraded = degraded
        self._samples: dict[_Class, dict[str, StreamingQuantile]] = {}

    def observe(self, replica: str, tier: str, stream: bool, ttft: float) -> None:
        """A call of ``tier`` (streaming or not) got its first token ``ttft`` s after its attempt on
        ``replica`` started."""
        per_replica = self._samples.setdefault((tier, stream), {})
        window = per_replica.get(replica)
        if window is None:
            window = per_replica[replica] = StreamingQuantile(self.WINDOW)
        window.add(max(0.0, ttft))

    def hedge_delay(self, tier: str, stream: bool) -> float:
        """Seconds to wait for a first token before hedging a call of this class (see the module docstring)."""
        policy = self._policy
        if policy.delay is not None:
            return policy.delay
        windows = self._counted(tier, stream)
        if windows is None:
            return policy.warmup_delay
        estimate = _lower_median([w.quantile(policy.quantile) or 0.0 for w in windows])
        return min(policy.max_delay, max(policy.min_delay, estimate))

    def typical(self, tier: str, stream: bool) -> float:
        """The median TTFT of the median healthy replica (0 while unknown): about how long a fresh
        attempt needs."""
        per_replica = self._samples.get((tier, stream))
        if not per_replica:
            return 0.0
        windows = self._healthy(per_replica) or [w for w in per_replica.values() if w.count]
        if not windows:
            return 0.0
        return _lower_median([w.quantile(0.5) or 0.0 for w in windows])

    def _counted(self, tier: str, stream: bool) -> list[StreamingQuantile] | None:
        """The windows the delay is read from, or None while the class is warming up."""
        per_replica = self._samples.get((tier, stream))
        if not per_replica or sum(w.count for w in per_replica.values()) < self._policy.min_samples:
            return None
        return (
            self._healthy(per_replica)
            or [w for w in per_replica.values() if w.count >= self.MIN_REPLICA_SAMPLES]
            or None
        )

    def _healthy(self, per_replica: dict[str, StreamingQuantile]) -> list[StreamingQuantile]:
        return [
            w for name, w in per_replica.items() if w.count >= self.MIN_REPLICA_SAMPLES and not self._degraded(name)
        ]

    def __repr__(self) -> str:
        classes = {f"{tier}/{'stream' if stream else 'body'}": len(r) for (tier, stream), r in self._samples.items()}
        return f"TTFTStats(replicas per class={classes})"


def _lower_median(values: list[float]) -> float:
    values.sort()
    return values[(len(values) - 1) // 2]
