"""Paged KV block bookkeeping: reference counts, prefix caching, LRU eviction and copy-on-write.

Pure Python: nothing here touches KV arrays. Calls say which blocks a sequence uses and which block
copies the caller must apply to the KV cache before the next forward.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ROOT_HASH = 0x5EED_C0DE_CAFE_F00D
"""The chain value standing before block 0 in `block_hash` chains."""

_NO_CONTENT = -1  # a block whose KV is not known to match any token prefix
_ROOT_CONTENT = 0  # the empty prefix: the parent of every block 0


def block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """Chained hash of one full block: Python's hash of ``(parent_hash, token_ids)``, 64 bits on 64-bit CPython.

    Hashes of ints and tuples are not salted by ``PYTHONHASHSEED``, so values agree between processes
    running the same CPython version (not across versions). Collisions are harmless: `BlockManager`
    verifies every hit, so a collision can only cost a miss.
    """
    return hash((parent_hash, token_ids))


@dataclass(frozen=True)
class CachedBlock:
    """A block filed in the prefix cache: its chained ``hash``, the chain value before it (``parent_hash``),
    its ``tokens`` and the ``content`` id of the token prefix its KV holds."""

    block: int
    hash: int
    parent_hash: int
    tokens: tuple[int, ...]
    content: int


@dataclass
class BlockTable:
    """One sequence's KV blocks, in position order, plus the chained hashes of its leading full blocks
    whose KV is known to the prefix cache (``hashes`` is a prefix of ``blocks``: ``hashes[i]`` is the
    `block_hash` chain value of block ``i``)."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


class BlockManager:
    """Hands out KV blocks to `BlockTable`s, with reference counts, prefix caching and copy-on-write.

    - Ref counts: a block's count is the number of tables holding it; `fork` shares blocks (n > 1
      completions share the prompt's KV). A block with count 0 is free.
    - Prefix caching: once a block is full and computed, `register_computed` files it under the chained
      hash of its tokens and all tokens before it; `allocate_prompt` reuses the longest run of cached
      leading blocks. Every cached block records its token ids and a *content id* naming the exact token
      prefix its KV was computed from; a hit must match the request's token ids and extend the content
      matched so far, so hash collisions never hand out wrong KV.
    - LRU: a cached block whose count drops to 0 stays cached while free, and free cached blocks are
      reused (evicting their hash) least recently freed first, a table's tail before its head. Free
      blocks holding nothing cached are always reused before any cached one.
    - Copy-on-write: `prepare_write` swaps each shared block a table is about to write for a private
      one and returns the ``(src, dst)`` copies the caller applies; the other holders keep the original.
      A private block that gets written loses its cache entry (its KV changes).
    - Eviction: ``on_evict(cached_block)``, when set, is called as a cached block is reused for something
      else, while its KV is still intact (the storage tiers keep a copy: `KVOffload`).
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 0 or block_size < 1:
            raise ValueError(f"need num_blocks >= 0 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_cache_queried_tokens = 0
        self.prefix_cache_hit_tokens = 0
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks  # the hash a cached block is filed under
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks  # a cached block's token ids
        self._parent: list[int] = [_NO_CONTENT] * num_blocks  # content id of the prefix a cached block extends
        self._parent_hash: list[int] = [ROOT_HASH] * num_blocks  # chain value before a cached block
        self._content: list[int] = [_NO_CONTENT] * num_blocks  # content id of the prefix held in a block's KV
        self._next_content = _ROOT_CONTENT + 1
        self._cache: dict[int, int] = {}  # hash -> cached block
        self._free_uncached: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.on_evict: Callable[[CachedBlock], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, cached-but-unreferenced ones included."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens over looked-up prompt tokens; 0.0 when nothing was looked up."""
        queried = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / queried if queried else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def ref_count(self, block: int) -> int:
        """How many tables hold ``block``."""
        return self._ref[block]

    def allocate_prompt(
        self,
        table: BlockTable,
        token_ids: Sequence[int],
        *,
        use_cache: bool,
        reusable: Callable[[int], bool] | None = None,
    ) -> int | None:
        """Give an empty ``table`` blocks covering all ``len(token_ids)`` tokens; return how many leading
        tokens already have their KV (a multiple of ``block_size``), or None when free blocks are short.

        With ``use_cache`` and prefix caching on, the longest cached run of full blocks among the first
        ``len(token_ids) - 1`` tokens is reused (the last prompt token is always computed, for its logits).
        ``reusable(content_id)``, when given, limits the run to the longest one whose last block's content
        id it accepts (hybrid models: a prefix whose recurrent state was saved). Atomic: None changes
        nothing. On success the query counters grow by ``len(token_ids)`` looked-up and the returned cached
        tokens (only when a lookup was made).
        """
        if table.blocks:
            raise ValueError("allocate_prompt needs an empty BlockTable")
        lookup = use_cache and self.enable_prefix_caching
        hits, hashes = self._longest_cached_prefix(token_ids) if lookup else ([], [])
        while hits and reusable is not None and not reusable(self._content[hits[-1]]):
            hits.pop()
            hashes.pop()
        fresh = self.blocks_for(len(token_ids)) - len(hits)
        revived = sum(1 for block in hits if self._ref[block] == 0)
        if fresh > self.num_free_blocks - revived:
            return None
        for block in hits:
            if self._ref[block] == 0:
                del self._free_cached[block]
            self._ref[block] += 1
        table.blocks.extend(hits)
        table.blocks.extend(self._take_free() for _ in range(fresh))
        table.hashes.extend(hashes)
        cached = len(hits) * self.block_size
        if lookup:
            self.prefix_cache_queried_tokens += len(token_ids)
            self.prefix_cache_hit_tokens += cached
        return cached

    def prepare_write(self, table: BlockTable, start: int, end: int) -> list[tuple[int, int]] | None:
        """Before computing positions ``start..end-1``: extend ``table`` to cover ``end`` tokens and make
        every block holding one of those positions private (copy-on-write for blocks with ref count > 1).

        Returns the ``(src, dst)`` block copies to apply to the KV cache before the forward (only for
        replaced blocks holding positions before ``start``; every dst is fresh, so the copies may be
        applied in any order or at once), or None, changing nothing, when free blocks are short.
        Written blocks lose their prefix-cache identity and ``table.hashes`` is cut to the blocks before
        ``start``'s block, so writes below ``start`` of an earlier forward must be redone before
        `register_computed` is called again.
        """
        if not 0 <= start <= end:
            raise ValueError(f"bad write range {start}..{end}")
        size = self.block_size
        first = start // size
        if end == start + 1 and first < len(table.blocks):  # a decode token: the common case, checked first
            block = table.blocks[first]
            if self._ref[block] == 1 and self._content[block] == _NO_CONTENT:  # private, never cached: no change
                del table.hashes[first:]
                return []
        needed = self.blocks_for(end)
        num_new = max(0, needed - len(table.blocks))
        written = range(first, min(needed, len(table.blocks))) if start < end else range(0)
        shared = [j for j in written if self._ref[table.blocks[j]] > 1]
        if num_new + len(shared) > self.num_free_blocks:
            return None
        copies = []
        for j in shared:
            src = table.blocks[j]
            table.blocks[j] = self._take_free()
            self._release(src)  # still held by the other sharers
            if j * size < start:
                copies.append((src, table.blocks[j]))
        for j in written:
            block = table.blocks[j]
            if self._content[block] != _NO_CONTENT:
                self._forget(block)
        if start < end:
            del table.hashes[start // size :]
        table.blocks.extend(self._take_free() for _ in range(num_new))
        return copies

    def register_computed(self, table: BlockTable, token_ids: Sequence[int], num_computed: int) -> None:
        """After a forward: file the table's full blocks whose positions are all below ``num_computed``
        in the prefix cache, extending ``table.hashes``. No-op when prefix caching is off.

        When another block already holds the same content under the hash, that entry is kept: this
        block stays uncached but adopts its content id, so the table's later blocks chain onto the
        cached entry and stay reachable. When the hash is taken by different content (a collision),
        the table's chain stops there; later calls retry that block.
        """
        if not self.enable_prefix_caching:
            return
        size = self.block_size
        full = min(num_computed, len(token_ids), len(table.blocks) * size) // size
        for i in range(len(table.hashes), full):
            ids = tuple(token_ids[i * size : (i + 1) * size])
            if i:
                parent_hash, parent = table.hashes[-1], self._content[table.blocks[i - 1]]
            else:
                parent_hash, parent = ROOT_HASH, _ROOT_CONTENT
            h = block_hash(parent_hash, ids)
            block = table.blocks[i]
            existing = self._cache.get(h)
            if existing is None:
                self._cache[h] = block
                self._hash[block], self._tokens[block], self._parent[block] = h, ids, parent
                self._parent_hash[block] = parent_hash
                self._content[block] = self._next_content
                self._next_content += 1
            elif self._tokens[existing] == ids and self._parent[existing] == parent:
                self._content[block] = self._content[existing]
            else:
                return
            table.hashes.append(h)

    def prefix_content(self, table: BlockTable, num_blocks: int) -> tuple[int, int] | None:
        """``(hash, content id)`` of the table's ``num_blocks``-th block when its first ``num_blocks``
        blocks are known to the prefix cache (`register_computed`), else None. The content id names the
        exact token prefix those blocks hold."""
        if not 0 < num_blocks <= len(table.hashes):
            return None
        return table.hashes[num_blocks - 1], self._content[table.blocks[num_blocks - 1]]

    def is_cached(self, block_hash: int, content: int) -> bool:
        """True while the prefix cache files a block holding ``content`` under ``block_hash`` (so a lookup
        can still reach that prefix)."""
        block = self._cache.get(block_hash)
        return block is not None and self._content[block] == content

    def cached_blocks(self) -> list[CachedBlock]:
        """Every block filed in the prefix cache (in use or free), least recently filed first."""
        return [self._cached(block) for block in self._cache.values()]

    def _cached(self, block: int) -> CachedBlock:
        h, tokens = self._hash[block], self._tokens[block]
        assert h is not None and tokens is not None, f"block {block} is not cached"
        return CachedBlock(block, h, self._parent_hash[block], tokens, self._content[block])

    def fork(self, table: BlockTable) -> BlockTable:
        """A new table sharing every block of ``table`` (ref counts + 1), with the same hashes."""
        for block in table.blocks:
            self._ref[block] += 1
        return BlockTable(list(table.blocks), list(table.hashes))

    def free(self, table: BlockTable) -> None:
        """Drop the table's references and leave it empty. Blocks reaching ref count 0 become free;
        cached ones stay cached until reused, queued tail block first so prefix heads live longest."""
        for block in reversed(table.blocks):
            self._release(block)
        table.blocks.clear()
        table.hashes.clear()

    def reset_prefix_cache(self) -> None:
        """Forget the cache entries of all free blocks (blocks in use stay cached). Counters are kept."""
        for block in self._free_cached:
            self._forget(block)
        self._free_uncached.extend(self._free_cached)
        self._free_cached.clear()

    def check_invariants(self) -> None:
        """Raise AssertionError describing the first inconsistency found (a full scan; for tests)."""
        free_uncached, free_cached = set(self._free_uncached), set(self._free_cached)
        assert len(free_uncached) == len(self._free_uncached), "a block is twice in the uncached free list"
        assert not free_uncached & free_cached, f"blocks in both free lists: {free_uncached & free_cached}"
        cached_contents = set()
        for block in range(self.num_blocks):
            ref, h = self._ref[block], self._hash[block]
            assert ref >= 0, f"block {block} has ref count {ref}"
            is_free = block in free_uncached or block in free_cached
            assert (ref == 0) == is_free, f"block {block}: ref count {ref} but free={is_free}"
            if h is None:
                assert block not in free_cached, f"uncached block {block} is in the cached free list"
                assert self._tokens[block] is None and self._parent[block] == _NO_CONTENT, f"block {block}: stale entry"
                assert ref > 0 or self._content[block] == _NO_CONTENT, f"free block {block} keeps a content id"
                continue
            assert block not in free_uncached, f"cached block {block} is in the uncached free list"
            assert self._cache.get(h) == block, f"block {block} is filed under {h} but the cache maps it elsewhere"
            tokens, parent, content = self._tokens[block], self._parent[block], self._content[block]
            assert tokens is not None and len(tokens) == self.block_size, f"block {block} stores tokens {tokens}"
            assert _ROOT_CONTENT <= parent < content < self._next_content, f"block {block}: bad content ids"
            assert content not in cached_contents, f"content id {content} is cached twice"
            cached_contents.add(content)
        assert len(self._cache) == len(cached_contents), "the cache maps hashes to blocks not filed under them"
        assert self.enable_prefix_caching or not self._cache, "prefix caching is off but blocks are cached"
        assert 0 <= self.prefix_cache_hit_tokens <= self.prefix_cache_queried_tokens, "bad prefix cache counters"

    def _longest_cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """The cached blocks (and their hashes) holding the longest reusable prefix of ``token_ids``."""
        size = self.block_size
        hits: list[int] = []
        hashes: list[int] = []
        parent_hash, parent = ROOT_HASH, _ROOT_CONTENT
        for i in range((len(token_ids) - 1) // size):
            ids = tuple(token_ids[i * size : (i + 1) * size])
            h = block_hash(parent_hash, ids)
            block = self._cache.get(h)
            if block is None or self._parent[block] != parent or self._tokens[block] != ids:
                break
            hits.append(block)
            hashes.append(h)
            parent_hash, parent = h, self._content[block]
        return hits, hashes

    def _take_free(self) -> int:
        """A free block with ref count 1, evicting the least recently freed cached one if no uncached is free."""
        if self._free_uncached:
            block = self._free_uncached.pop()
        else:
            block, _ = self._free_cached.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(self._cached(block))
            self._forget(block)
        self._ref[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if self._hash[block] is None:
                self._content[block] = _NO_CONTENT
                self._free_uncached.append(block)
            else:
                self._free_cached[block] = None

    def _forget(self, block: int) -> None:
        """Remove a block's prefix-cache entry (if it is filed under a hash) and clear its cache fields
        and content id."""
        if (key := self._hash[block]) is not None:
            del self._cache[key]
        self._hash[block] = self._tokens[block] = None
        self._parent[block] = self._content[block] = _NO_CONTENT
