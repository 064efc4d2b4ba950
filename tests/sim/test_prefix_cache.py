"""The prefix cache on its own: chained block hashes, prefix lookups, LRU eviction from the tails, counters."""

from __future__ import annotations

import pytest

from llmguard_tools.sim.prefix_cache import BlockHasher, PrefixCache


def hashes(*messages: tuple[str, str], block: int = 4) -> tuple[bytes, ...]:
    hasher = BlockHasher(block)
    for role, text in messages:
        hasher.feed(text, role)
    return hasher.hashes()


def words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_only_full_blocks_are_hashed_and_each_hash_covers_its_whole_prefix() -> None:
    a = hashes(("system", words("s", 10)))
    assert len(a) == 2  # 10 words, blocks of 4: the last 2 words make no block
    b = hashes(("system", "x " + words("s", 9)))  # same second block's words, different first block
    assert a[0] != b[0] and a[1] != b[1]
    assert hashes(("system", words("s", 10))) == a  # deterministic


def test_split_across_messages_and_roles_count() -> None:
    one = hashes(("system", words("s", 4)), ("user", words("u", 4)))
    assert len(one) == 2
    assert hashes(("system", words("s", 4)), ("assistant", words("u", 4)))[1] != one[1]
    assert hashes(("system", words("s", 4)), ("user", words("u", 4)), ("user", words("v", 4)))[:2] == one


def test_lookup_counts_the_leading_cached_blocks_in_tokens_and_leaves_one_block_to_compute() -> None:
    cache = PrefixCache(capacity_tokens=64, block_tokens=4)
    first = hashes(("system", words("s", 12)))
    assert cache.lookup(first, 12) == 0
    cache.insert(first)
    longer = hashes(("system", words("s", 12)), ("user", words("u", 6)))
    assert cache.lookup(longer, 18) == 12
    assert cache.lookup(first, 12) == 8  # fully cached: the last block is recomputed, as vLLM does
    other = hashes(("system", "different " + words("s", 11)))
    assert cache.lookup(other, 12) == 0  # a changed first block misses everything after it
    assert (cache.counters.queries, cache.counters.hits) == (12 + 18 + 12 + 12, 12 + 8)
    cache.reset_counters()
    assert (cache.counters.queries, cache.counters.hits, len(cache)) == (0, 0, 3)


def test_eviction_is_least_recently_used_and_eats_prefixes_from_their_tails() -> None:
    cache = PrefixCache(capacity_tokens=16, block_tokens=4)  # 4 blocks
    a = hashes(("system", words("a", 12)))
    b = hashes(("system", words("b", 8)))
    cache.insert(a)
    cache.insert(b)  # 5 blocks: a's tail block goes
    assert len(cache) == 4
    assert cache.lookup(a, 13) == 8 and cache.lookup(b, 9) == 8


def test_a_zero_capacity_cache_is_off_and_counts_nothing() -> None:
    cache = PrefixCache(capacity_tokens=0, block_tokens=16)
    cache.insert(hashes(("system", words("s", 32)), block=16))
    assert not cache.enabled and len(cache) == 0
    assert cache.lookup(hashes(("system", words("s", 32)), block=16), 32) == 0
    assert cache.counters.queries == 0


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="block_tokens must be >= 1"):
        BlockHasher(0)
    with pytest.raises(ValueError, match="capacity_tokens must be >= 0"):
        PrefixCache(-1, 16)


def test_a_text_fed_in_pieces_hashes_as_fed_at_once_and_its_words_are_counted() -> None:
    whole = BlockHasher(4)
    whole.feed(words("w", 11), "system")
    exact = BlockHasher(4)
    split = words("w", 11).split()
    exact.feed(" ".join(split[:2]), "system")  # blocks left open across feeds
    exact.feed(" ".join(split[2:7]))
    exact.feed(" ".join(split[7:]))
    assert exact.hashes() == whole.hashes() and len(whole.hashes()) == 2
    assert exact.tokens == whole.tokens == 11  # the role tag is not a token
