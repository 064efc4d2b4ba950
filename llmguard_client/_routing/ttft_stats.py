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
   (p95 by default), clamped to [``min_delay``, cap], the cap being ``max_delay`` or `TTFTStats.TYPICAL_FACTOR`
   (2) times the typical TTFT (the lower median of the replicas' medians), whichever is longer;
4. a call whose primary went to a replica that counts but is slower than that (its own quantile is
   higher) waits for its own quantile instead, at most `TTFTStats.OWN_DELAY_CAP` times the delay of
   rule 3 (and the cap): a hedge is for a call that is slow *for its replica*, and a replica that
   is degraded but not yet drained still has its calls hedged early enough to help. A merely slower
   replica's ordinary calls were otherwise hedged, and each hedge that lost to its primary cost the
   other replica a prefill for nothing (wasted work in the ``faults`` benchmark, docs/benchmarks.md).
   Drained replicas are left to rule 2: their probes are hedged after a typical healthy TTFT;
5. until the class has ``min_samples`` samples in all, the delay is ``warmup_delay``, or from
   `TTFTStats.MIN_WARMUP_SAMPLES` (3) samples on, twice the typical TTFT if that is longer.

The cap of rule 3 is for a heavy tail: calls typically 0.3 s whose p95 lands among 10 s stalls are hedged at
``max_delay``. It is no reason to hedge calls that are all slow: when the typical TTFT itself is above
``max_delay`` (a reasoning model thinking 3 s before its first token), a cap of ``max_delay`` hedged every call
before its first token could come, and the hedge, needing as long, lost nearly always: the servers did twice
the work, the budget paid for it, and no call was faster. A hedge sent at d wins only over a primary slower
than d plus a fresh attempt's TTFT; sent before the typical TTFT, it mostly races calls that are not slow at
all. So the cap is never below twice the typical TTFT: a call is hedged when it is slower than its class's
p95, or (a heavy tail) than twice the typical TTFT, which is slow for any shape of tail, and its hedge then
answers at about three times the typical TTFT. A class typically under ``max_delay`` / 2 is not changed by
this. Likewise the warm-up delay, a guess before any measurement, gives way to twice the typical TTFT once a
median of three samples shows the guess is short (a median, so one slow first call does not make it).

Calls are also told apart by the size of their prompt (`size_class`: a class per doubling of its characters, from
2,048 on): a long prompt's prefill makes its first token slow by nature, and one window of long and short calls
hedged the long ones at the short ones' p95, nearly always for nothing (a fresh attempt prefills as long). A
call's delay is read from its size class by the same rules once that class is warm (``min_samples`` samples),
until then from all calls of its tier and stream kind, but at least twice the size class's typical TTFT from its
third sample on (rule 5's guess, so that the first long prompts are not all hedged while their class warms up).
`TTFTStats.typical` and `TTFTStats.high` are read from the size class once it is warm.

Calls with an affinity key are told apart by whether they were expected to find their prompt prefix in the
replica's cache (sent to the replica that answered the key's last call: `AffinityRouting.expected_hit`): a
cached prefill is several times shorter, so one window of both kinds hedges cached calls late and uncached ones
early. Their TTFTs also go to a class of their own, cached or uncached, and a keyed call's delay is read from
its class by the same rules, once its replica has `TTFTStats.MIN_CLASS_SAMPLES` samples there and the class is
warm; until then from its size class, or all calls of its tier and stream kind.

A slow minority of replicas therefore cannot drag the delay up: with three replicas, one of them 10x
slower moves the median of the three p95s not at all, even before the router drains it. A quantile of
all TTFTs pooled together, by contrast, learns the slow replica's TTFT as soon as it holds more than
5 % of the samples, and the hedge then fires too late to help.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llmguard_client._routing.quantile import StreamingQuantile, lower_median
from llmguard_client.config import HedgePolicy

__all__ = ["TTFTStats", "size_class"]

SIZE_CLASS_BASE = 1024
"""Prompt characters (about 256 tokens) of the first doubling: class 0 is under twice this, class k under
``2 ** (k + 1)`` times it."""
SIZE_CLASSES = 12
"""Classes kept: prompts of 2M characters and more share the last."""

_Key = tuple[str, bool, bool | None, int | None]
"""(tier, stream, expected cache hit or None, size class or None): both None for all calls of a tier and kind."""


def size_class(prompt_chars: int) -> int:
    """The TTFT class of a prompt of ``prompt_chars`` characters: one per doubling from `SIZE_CLASS_BASE` x 2."""
    if prompt_chars < 2 * SIZE_CLASS_BASE:
        return 0
    return min(SIZE_CLASSES - 1, int(math.log2(prompt_chars / SIZE_CLASS_BASE)))


def _never_degraded(name: str) -> bool:
    return False


def _no_epoch() -> int:
    return 0


class _ClassStats:
    """One (tier, stream) class: a window per replica, and the estimates last read from them."""

    __slots__ = ("delay", "epoch", "high", "own", "samples", "since", "typical", "warmup", "windows")

    def __init__(self) -> None:
        self.windows: dict[str, StreamingQuantile] = {}
        self.since = 0
        """Samples added since the estimates were computed."""
        self.samples = 0
        """Samples in all the windows when the estimates were computed."""
        self.epoch = -1
        self.delay: float | None = None
        self.warmup = 0.0
        """The delay while ``delay`` is None (warming up): rule 5."""
        self.own: dict[str, float] = {}
        """Rule 4: a counted replica's own (clamped) quantile, where it is above ``delay``."""
        self.typical = 0.0
        self.high = 0.0
        """The lower median of the healthy replicas' ``HedgePolicy.quantile`` (p95), unclamped (0 while unknown)."""


class TTFTStats:
    """Per-replica TTFT windows for each (tier, stream) class, and the estimates read from them.

    The estimates are recomputed when `RECOMPUTE_EVERY` samples have arrived since the last time, or
    when the set of drained replicas changed, not on every read: a p95 over 128 samples per replica
    moves slowly, and a read happens on every call.
    """

    WINDOW = 128
    MIN_REPLICA_SAMPLES = 5
    MIN_CLASS_SAMPLES = 10
    """A replica's samples of expected cache hits (or misses) before a keyed call's delay is read from them."""
    RECOMPUTE_EVERY = 8
    OWN_DELAY_CAP = 2.0
    TYPICAL_FACTOR = 2.0
    """The delay may rise to this many times the typical (median) TTFT, above ``max_delay`` (rules 3 and 5)."""
    MIN_WARMUP_SAMPLES = 3
    """Samples of a class before its typical TTFT can lengthen the warm-up delay (rule 5)."""

    def __init__(
        self,
        policy: HedgePolicy,
        degraded: Callable[[str], bool] = _never_degraded,
        epoch: Callable[[], int] = _no_epoch,
    ) -> None:
        """``policy`` gives the quantile, the clamps and the warm-up; ``degraded(replica)`` tells which
        replicas to leave out (the router's drained ones), and ``epoch()`` changes whenever that does."""
        self._policy = policy
        self._degraded = degraded
        self._epoch = epoch
        self._classes: dict[_Key, _ClassStats] = {}
        self._sizes: dict[tuple[str, bool], dict[int, int]] = {}
        """First tokens seen so far of each size class, per tier and kind (which class is the most frequent)."""

    def observe(
        self, replica: str, tier: str, stream: bool, ttft: float, cached: bool | None = None, size: int | None = None
    ) -> None:
        """A call of ``tier`` (streaming or not) got its first token ``ttft`` s after its attempt on
        ``replica`` started; ``cached``: a keyed call expected to hit the replica's prefix cache, or not
        (None: unkeyed); ``size``: its prompt's `size_class` (None: not told)."""
        self._add((tier, stream, None, None), replica, ttft)
        if size is not None:
            self._add((tier, stream, None, size), replica, ttft)
            seen = self._sizes.setdefault((tier, stream), {})
            seen[size] = seen.get(size, 0) + 1
        if cached is not None:
            self._add((tier, stream, cached, None), replica, ttft)

    def _add(self, cls: _Key, replica: str, ttft: float) -> None:
        stats = self._classes.get(cls)
        if stats is None:
            stats = self._classes[cls] = _ClassStats()
        window = stats.windows.get(replica)
        if window is None:
            window = stats.windows[replica] = StreamingQuantile(self.WINDOW)
        window.add(max(0.0, ttft))
        stats.since += 1

    def hedge_delay(
        self,
        tier: str,
        stream: bool,
        replica: str | None = None,
        cached: bool | None = None,
        size: int | None = None,
    ) -> float:
        """Seconds to wait for a first token before hedging a call of this class whose primary went to
        ``replica``, expected to hit its prefix cache (``cached``) or not, or unkeyed (None), its prompt of
        `size_class` ``size`` (None: any); see the module docstring."""
        policy = self._policy
        if policy.delay is not None:
            return policy.delay
        if cached is not None and replica is not None:
            split = self._fresh((tier, stream, cached, None))
            window = split.windows.get(replica) if split is not None else None
            if window is not None and window.count >= self.MIN_CLASS_SAMPLES and split and split.delay is not None:
                return split.own.get(replica, split.delay)
        split = None if size is None else self._fresh((tier, stream, None, size))
        if split is not None and split.delay is not None:
            return split.own.get(replica, split.delay) if replica is not None and split.own else split.delay
        stats = self._fresh((tier, stream, None, None))
        if stats is None:
            return policy.warmup_delay
        if stats.delay is None:
            delay = stats.warmup
        else:
            delay = stats.own.get(replica, stats.delay) if replica is not None and stats.own else stats.delay
        if split is not None and split.samples >= self.MIN_WARMUP_SAMPLES:  # rule 5's guess for a size class
            delay = max(delay, self.TYPICAL_FACTOR * split.typical)
        return delay

    def typical(self, tier: str, stream: bool, size: int | None = None) -> float:
        """The median TTFT of the median healthy replica for prompts of `size_class` ``size`` (0 while
        unknown; None: any size): about how long a fresh attempt needs."""
        stats = self._sized(tier, stream, size)
        return 0.0 if stats is None else stats.typical

    def high(self, tier: str, stream: bool, size: int | None = None) -> float:
        """The p95 (``HedgePolicy.quantile``) TTFT of the median healthy replica for prompts of `size_class`
        ``size``, unclamped (0 while unknown): a fresh attempt that has this long left usually makes its
        deadline."""
        stats = self._sized(tier, stream, size)
        return 0.0 if stats is None else stats.high

    def scale(self, tier: str, stream: bool, size: int | None) -> float | None:
        """What a first token of a prompt of `size_class` ``size`` is multiplied by to compare with a typical
        call's: the typical TTFT of the tier and kind's most frequent size class over that of ``size``'s, each
        once it has `MIN_WARMUP_SAMPLES` first tokens. Before ``size``'s has, None (its calls say nothing yet of a
        replica's speed) if another size class has; else 1 (a Guard's first calls are taken as they are). The
        router judges a replica's speed by scaled samples, so a replica that happened to get the long prompts is
        not taken for a slow one. (Not all calls' typical TTFT: early on, long prompts can make up half of a
        replica's few samples, and a short call's would then be scaled up.)"""
        sizes = self._sizes.get((tier, stream))
        if size is None or not sizes:
            return 1.0
        common = max(sizes, key=sizes.__getitem__)
        if sizes.get(size, 0) < self.MIN_WARMUP_SAMPLES:
            return None if sizes[common] >= self.MIN_WARMUP_SAMPLES else 1.0
        if size == common:
            return 1.0
        mine, usual = self._fresh((tier, stream, None, size)), self._fresh((tier, stream, None, common))
        if mine is None or usual is None or mine.typical <= 0.0 or usual.typical <= 0.0:
            return 1.0
        return usual.typical / mine.typical

    def _sized(self, tier: str, stream: bool, size: int | None) -> _ClassStats | None:
        """The size class's stats once warm, else those of every call of the tier and kind."""
        split = None if size is None else self._fresh((tier, stream, None, size))
        if split is not None and split.delay is not None:
            return split
        return self._fresh((tier, stream, None, None))

    def _fresh(self, key: _Key) -> _ClassStats | None:
        stats = self._classes.get(key)
        if stats is None:
            return None
        epoch = self._epoch()
        if stats.since >= self.RECOMPUTE_EVERY or stats.epoch != epoch or (stats.delay is None and stats.since):
            self._compute(stats)
            stats.since, stats.epoch = 0, epoch
        return stats

    def _compute(self, stats: _ClassStats) -> None:
        policy = self._policy
        enough = {name: w for name, w in stats.windows.items() if w.count >= self.MIN_REPLICA_SAMPLES}
        healthy = {name: w for name, w in enough.items() if not self._degraded(name)} or enough
        counted = healthy or {name: w for name, w in stats.windows.items() if w.count}
        quantiles = {name: w.quantile(policy.quantile) or 0.0 for name, w in counted.items()}
        stats.typical = lower_median([w.quantile(0.5) or 0.0 for w in counted.values()]) or 0.0
        stats.high = lower_median(list(quantiles.values())) or 0.0
        stats.own = {}
        longest = max(policy.max_delay, self.TYPICAL_FACTOR * stats.typical)
        stats.samples = samples = sum(w.count for w in stats.windows.values())
        if not healthy or samples < policy.min_samples:
            stats.delay = None  # warming up
            known = samples >= self.MIN_WARMUP_SAMPLES  # a median of three: not one slow first call's
            stats.warmup = max(policy.warmup_delay, self.TYPICAL_FACTOR * stats.typical if known else 0.0)
            return
        stats.delay = delay = min(longest, max(policy.min_delay, stats.high))  # counted is healthy here
        cap = min(longest, self.OWN_DELAY_CAP * delay)
        stats.own = {name: min(cap, q) for name, q in quantiles.items() if q > delay}

    def __repr__(self) -> str:
        kinds = {None: "", True: "/cached", False: "/uncached"}
        classes = {
            f"{tier}/{'stream' if stream else 'body'}{kinds[cached]}{'' if size is None else f'/size{size}'}": len(
                c.windows
            )
            for (tier, stream, cached, size), c in self._classes.items()
        }
        return f"TTFTStats(replicas per class={classes})"
