"""`BlockManager`: prefix cache hits, LRU eviction, collision safety, copy-on-write, atomic failures (the stateful
property tests are in test_block_manager_stateful.py)."""

from __future__ import annotations

import pytest

from atlas_core.engine import block_manager
from atlas_core.engine.block_manager import BlockManager, BlockTable


def run_prompt(manager: BlockManager, tokens: list[int], *, use_cache: bool = True) -> tuple[BlockTable, int]:
    """Allocate, compute and register a whole prompt as the engine does; returns (table, cached tokens)."""
    table = BlockTable()
    cached = manager.allocate_prompt(table, tokens, use_cache=use_cache)
    assert cached is not None
    assert manager.prepare_write(table, cached, len(tokens)) == []
    manager.register_computed(table, tokens, len(tokens))
    manager.check_invariants()
    return table, cached


def fillers(manager: BlockManager, count: int) -> list[int]:
    """The blocks taken by ``count`` one-token requests (each takes one fresh block and caches nothing)."""
    tables = [BlockTable() for _ in range(count)]
    assert all(manager.allocate_prompt(table, [42], use_cache=True) == 0 for table in tables)
    return [table.blocks[0] for table in tables]


def test_prefix_hit_after_request_finished_and_while_running() -> None:
    manager = BlockManager(8, 4)
    assert manager.hit_rate == 0.0
    prompt = list(range(10))
    first, cached = run_prompt(manager, prompt)
    assert cached == 0 and len(first.blocks) == 3 and len(first.hashes) == 2
    blocks, hashes = list(first.blocks), list(first.hashes)
    manager.free(first)
    assert first == BlockTable() and manager.num_free_blocks == 8
    second, cached = run_prompt(manager, prompt)
    assert cached == 8 and second.blocks[:2] == blocks[:2] and second.hashes == hashes
    assert manager.num_free_blocks == 5
    assert (manager.prefix_cache_queried_tokens, manager.prefix_cache_hit_tokens) == (20, 8)
    assert manager.hit_rate == pytest.approx(0.4)
    third, cached = run_prompt(manager, prompt)  # the second still runs: its blocks are shared
    assert cached == 8 and third.blocks[:2] == blocks[:2] and third.blocks[2] != second.blocks[2]
    assert [manager.ref_count(b) for b in third.blocks] == [2, 2, 1]


def test_partial_hits_never_cover_the_last_prompt_token() -> None:
    manager = BlockManager(32, 4)
    prompt = list(range(8))  # exactly 2 full blocks
    first, _ = run_prompt(manager, prompt)
    hashes = list(first.hashes)
    manager.free(first)
    again, cached = run_prompt(manager, prompt)
    assert cached == 4  # only the full blocks before the last token: 1 of 2
    assert again.hashes == hashes  # block 1 was recomputed and recognised as a duplicate of the cached one
    assert run_prompt(manager, prompt + [8])[1] == 8
    assert run_prompt(manager, prompt[:4])[1] == 0
    assert run_prompt(manager, prompt[:6] + [99] * 6)[1] == 4  # diverges inside block 1
    assert run_prompt(manager, [99] + prompt[1:])[1] == 0  # diverges in block 0: nothing reusable


def test_use_cache_false_skips_the_lookup_but_still_registers() -> None:
    manager = BlockManager(16, 4)
    prompt = list(range(10))
    first, _ = run_prompt(manager, prompt)
    second, cached = run_prompt(manager, prompt, use_cache=False)
    assert cached == 0 and not set(second.blocks) & set(first.blocks)
    assert manager.prefix_cache_queried_tokens == 10  # only the first lookup counts
    assert second.hashes == first.hashes  # computed duplicates of the cached blocks


def test_lru_evicts_least_recently_freed_and_tail_before_head() -> None:
    manager = BlockManager(6, 2)
    table_a, table_b = run_prompt(manager, [1, 2, 3, 4, 5])[0], run_prompt(manager, [6, 7, 8, 9, 10])[0]
    assert table_a.blocks == [0, 1, 2] and table_b.blocks == [3, 4, 5]
    manager.free(table_a)
    manager.free(table_b)
    # Free now: 2 and 5 (caching nothing), then cached 1, 0 (a, tail first), 4, 3 (b).
    taken = fillers(manager, 3)
    assert set(taken[:2]) == {2, 5} and taken[2] == 1  # then a's tail: least recently freed, tail first


def test_eviction_removes_the_hash_and_hits_refresh_recency() -> None:
    manager = BlockManager(6, 2)
    a, b = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    table_a, table_b = run_prompt(manager, a)[0], run_prompt(manager, b)[0]
    manager.free(table_a)
    manager.free(table_b)
    table_a, cached = run_prompt(manager, a)  # revives a's blocks 0 and 1
    manager.free(table_a)  # so they are now the most recently freed
    assert cached == 4 and fillers(manager, 3)[2] == 4  # b's tail goes first now
    manager.check_invariants()
    assert run_prompt(manager, b)[1] == 2  # b's evicted tail lost its hash; its head still hits


def test_hash_collisions_never_reuse_wrong_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_manager, "block_hash", lambda parent_hash, token_ids: 7)
    manager = BlockManager(16, 4)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 5]  # two blocks with equal tokens at different positions
    first, _ = run_prompt(manager, prompt)
    assert first.hashes == [7]  # block 1 collides with block 0's entry: its chain stops
    head = first.blocks[0]
    manager.free(first)
    again, cached = run_prompt(manager, prompt)
    assert cached == 4 and again.blocks[0] == head and again.blocks[1] != head
    assert run_prompt(manager, [9, 9, 9, 9, 1, 2, 3, 4, 5])[1] == 0
    assert run_prompt(manager, [1, 2, 3, 4, 9])[1] == 4

    # A hash blind to the prefix: block 1 of these prompts collides although block 0 differs.
    monkeypatch.setattr(block_manager, "block_hash", lambda parent_hash, token_ids: hash(token_ids))
    manager = BlockManager(16, 4)
    manager.free(run_prompt(manager, [1, 1, 1, 1, 5, 6, 7, 8, 0])[0])
    manager.free(run_prompt(manager, [2, 2, 2, 2, 0])[0])
    assert run_prompt(manager, [2, 2, 2, 2, 5, 6, 7, 8, 0])[1] == 4
    assert run_prompt(manager, [1, 1, 1, 1, 5, 6, 7, 8, 0])[1] == 8


def test_cow_after_fork() -> None:
    manager = BlockManager(8, 4)
    parent, _ = run_prompt(manager, list(range(6)))
    b0, b1 = parent.blocks
    child = manager.fork(parent)
    assert child == parent and child is not parent and manager.ref_count(b0) == manager.ref_count(b1) == 2
    copies = manager.prepare_write(child, 6, 7)  # the shared, partly filled block 1 gets written
    assert copies is not None and len(copies) == 1
    src, dst = copies[0]
    assert src == b1 and child.blocks == [b0, dst] and dst not in (b0, b1) and parent.blocks == [b0, b1]
    assert [manager.ref_count(b) for b in (b0, b1, dst)] == [2, 1, 1]
    assert manager.prepare_write(parent, 6, 7) == [] and parent.blocks == [b0, b1]  # b1 is private now
    assert manager.prepare_write(parent, 8, 9) == [] and len(parent.blocks) == 3
    manager.check_invariants()

    fresh = BlockTable()  # a shared block overwritten from its first position needs no copy
    assert manager.allocate_prompt(fresh, [7] * 8, use_cache=True) == 0
    fork = manager.fork(fresh)
    assert manager.prepare_write(fork, 0, 8) == [] and not set(fork.blocks) & set(fresh.blocks)


def test_rewriting_a_cached_private_block_uncaches_it() -> None:
    manager = BlockManager(8, 4)
    table = run_prompt(manager, list(range(8)))[0]
    assert manager.prepare_write(table, 6, 8) == [] and len(table.hashes) == 1  # rejected speculative tokens
    manager.check_invariants()
    assert run_prompt(manager, list(range(9)))[1] == 4


def test_rewriting_one_token_of_a_cached_block_uncaches_it() -> None:
    """A one-token write (a decode token, which takes `prepare_write`'s fast path when its block is private and
    uncached) into a cached block still forgets the block's cache entry."""
    manager = BlockManager(8, 4)
    table = run_prompt(manager, list(range(8)))[0]
    assert manager.prepare_write(table, 7, 8) == [] and len(table.hashes) == 1
    manager.check_invariants()
    assert run_prompt(manager, list(range(9)))[1] == 4


def test_concurrent_duplicates_chain_onto_the_cached_entry() -> None:
    manager = BlockManager(16, 4)
    shared = list(range(8))
    a, b = shared + [100], shared + [200] * 4 + [201]
    table_a, table_b = BlockTable(), BlockTable()
    assert manager.allocate_prompt(table_a, a, use_cache=True) == 0
    assert manager.allocate_prompt(table_b, b, use_cache=True) == 0  # admitted before a registered anything
    for table, tokens in ((table_a, a), (table_b, b)):
        assert manager.prepare_write(table, 0, len(tokens)) == []
        manager.register_computed(table, tokens, len(tokens))
    assert table_b.hashes[:2] == table_a.hashes and len(table_b.hashes) == 3
    manager.free(table_a)
    manager.free(table_b)
    assert run_prompt(manager, shared + [200] * 4 + [7])[1] == 12  # a's blocks, then b's own chained on


def test_chunked_prefill_registers_as_it_goes() -> None:
    manager = BlockManager(8, 4)
    prompt, table = list(range(10)), BlockTable()
    assert manager.allocate_prompt(table, prompt, use_cache=True) == 0
    for computed, registered in ((5, 1), (10, 2), (10, 2)):  # the last call changes nothing
        manager.register_computed(table, prompt, computed)
        assert len(table.hashes) == registered


def test_prefix_caching_disabled() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=False)
    (first, cached_first), (second, cached_second) = run_prompt(manager, [1] * 10), run_prompt(manager, [1] * 10)
    assert cached_first == cached_second == 0 and first.hashes == second.hashes == []
    assert not set(first.blocks) & set(second.blocks)
    assert manager.prefix_cache_queried_tokens == 0 and manager.hit_rate == 0.0


def test_allocate_prompt_failure_changes_nothing() -> None:
    manager = BlockManager(3, 2)
    prompt = [1, 2, 3, 4, 5]
    manager.free(run_prompt(manager, prompt)[0])
    counters = (manager.prefix_cache_queried_tokens, manager.prefix_cache_hit_tokens)
    # 2 cached blocks would be revived from the free pool, leaving 1 for the 2 or 3 fresh ones needed.
    for tokens in ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]):
        table = BlockTable()
        assert manager.allocate_prompt(table, tokens, use_cache=True) is None
        assert table == BlockTable() and manager.num_free_blocks == 3
        assert (manager.prefix_cache_queried_tokens, manager.prefix_cache_hit_tokens) == counters
        manager.check_invariants()
    assert run_prompt(manager, prompt)[1] == 4


def test_prepare_write_failure_changes_nothing() -> None:
    manager = BlockManager(2, 4)
    table = BlockTable()
    assert manager.allocate_prompt(table, list(range(6)), use_cache=True) == 0
    assert manager.prepare_write(table, 0, 6) == []
    assert manager.prepare_write(table, 6, 9) is None and len(table.blocks) == 2  # needs a third block
    child = manager.fork(table)
    assert manager.prepare_write(child, 6, 7) is None  # copy-on-write needs a free block
    assert child.blocks == table.blocks and all(manager.ref_count(b) == 2 for b in table.blocks)
    manager.check_invariants()


def test_sizes_and_misuse() -> None:
    manager = BlockManager(8, 4)
    assert [manager.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert run_prompt(manager, [])[0] == BlockTable()  # an empty prompt needs no block
    table, _ = run_prompt(manager, [1, 2, 3])
    with pytest.raises(ValueError, match="empty"):
        manager.allocate_prompt(table, [1], use_cache=True)
    with pytest.raises(ValueError, match="range"):
        manager.prepare_write(table, 5, 4)
    for args in ((-1, 4), (4, 0)):
        with pytest.raises(ValueError):
            BlockManager(*args)


def test_reset_prefix_cache_forgets_only_free_blocks() -> None:
    manager = BlockManager(16, 4)
    a, b = list(range(9)), list(range(100, 109))
    manager.free(run_prompt(manager, a)[0])
    run_prompt(manager, b)  # still running: its blocks stay cached through the reset
    manager.reset_prefix_cache()
    manager.check_invariants()
    assert manager.num_free_blocks == 16 - 3 and run_prompt(manager, a)[1] == 0 and run_prompt(manager, b)[1] == 8
