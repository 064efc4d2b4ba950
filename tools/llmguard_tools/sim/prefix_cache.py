"""A replica's prefix cache: an LRU of full prompt blocks keyed by chained block hashes, like vLLM's.

A prompt is a sequence of tokens (the sim counts whitespace-separated words as tokens); `block_hashes` cuts it
into blocks of ``block_tokens`` and hashes each block together with the hash of the block before it, so a block
hash stands for the whole prefix up to the block's end (only full blocks are hashed, as in vLLM). A lookup walks
the hashes from the first and stops at the first block not cached; prefill then skips the cached tokens.

Simplification: the cache has its own capacity (in tokens) instead of living in the KV pool's free blocks, and
only prompt blocks are cached (not the tokens a request generated), so a conversation's next turn hits its
previous prompt but recomputes the previous answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BlockHasher", "CacheCounters", "PrefixCache"]


class BlockHasher:
    """Chained block hashes of a token stream fed piece by piece (`feed` each message's text, then `hashes`).

    A block's hash is Python's ``hash`` of the previous block's hash and the block's words, as vLLM's default
    prefix-cache hash is of its block's token ids: cheap (a request costs one ``split`` per message and one
    tuple hash per block) and, like ``hash`` itself, meaningful within the process that computed it, where the
    sim's caches live.
    """

    __slots__ = ("_block", "_hashes", "_pending", "_prev", "tokens")

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self._block = block_tokens
        self._pending: list[str] = []
        self._hashes: list[int] = []
        self._prev = 0
        self.tokens = 0
        """Words fed so far."""

    def feed(self, text: str, tag: str = "") -> None:
        """Append the words of ``text``; ``tag`` (a role) marks where a message starts, not counted as a token."""
        words = text.split()
        if not words:
            return
        self.tokens += len(words)
        if tag:
            words[0] = f"{tag}\x1e{words[0]}"
        block, pending, hashes, start = self._block, self._pending, self._hashes, 0
        if pending:  # complete the block the previous text left open
            start = block - len(pending)
            pending += words[:start]
            if len(pending) < block:
                return
            self._prev = hash((self._prev, *pending))
            hashes.append(self._prev)
            pending.clear()
        prev, end = self._prev, start + (len(words) - start) // block * block
        for i in range(start, end, block):
            prev = hash((prev, *words[i : i + block]))
            hashes.append(prev)
        self._prev = prev
        pending += words[end:]

    def hashes(self) -> tuple[int, ...]:
        """The hashes of the full blocks fed so far."""
        return tuple(self._hashes)


@dataclass(slots=True)
class CacheCounters:
    """vLLM v1's prefix-cache counters, in tokens: prompt tokens looked up, and those found cached."""

    queries: int = 0
    hits: int = 0


class PrefixCache:
    """An LRU of block hashes holding at most ``capacity_tokens // block_tokens`` blocks (0: disabled)."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        if capacity_tokens < 0 or block_tokens < 1:
            raise ValueError("capacity_tokens must be >= 0 and block_tokens >= 1")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.counters = CacheCounters()

    @property
    def enabled(self) -> bool:
        """Whether the cache can hold anything."""
        return self.capacity_blocks > 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, hashes: Iterable[int], prompt_tokens: int) -> int:
        """Tokens of a ``prompt_tokens``-token prompt already cached (its leading cached blocks); counts the query.

        At least one token is always left to compute (as vLLM does: a fully cached prompt recomputes its last
        block), so the answer is below ``prompt_tokens``. Hit blocks become the most recently used.
        """
        if not self.enabled:
            return 0
        blocks = self._blocks
        hits: list[int] = []
        for h in hashes:
            if h not in blocks:
                break
            hits.append(h)
        for h in reversed(hits):  # a prefix's head ends up the most recent: tails are evicted first
            blocks.move_to_end(h)
        cached = len(hits) * self.block_tokens
        if cached >= prompt_tokens:
            cached = max(0, cached - self.block_tokens)
        self.counters.queries += prompt_tokens
        self.counters.hits += cached
        return cached

    def insert(self, hashes: Iterable[int]) -> None:
        """Cache a prompt's blocks, evicting the least recently used beyond capacity.

        The first block becomes the most recent, so eviction eats prefixes from their tails (as vLLM frees a
        request's blocks in reverse order), keeping the shared heads longest.
        """
        if not self.enabled:
            return
        blocks = self._blocks
        for h in reversed(tuple(hashes)):
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def reset_counters(self) -> None:
        """Zero the counters (the cached blocks stay)."""
        self.counters = CacheCounters()

    def clear(self) -> None:
        """Drop every cached block and zero the counters."""
        self._blocks.clear()
        self.reset_counters()
