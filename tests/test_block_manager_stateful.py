"""`BlockManager` driven like an engine by stateful property tests (prompts, repeats, chunked computes, rewrites,
forks, frees, prefix-cache resets) and checked against a shadow KV cache: ref counts, free blocks, KV never
overwritten, hash chains; with prefix caching off, and with a hash that always collides."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from atlas_core.engine import block_manager
from atlas_core.engine.block_manager import ROOT_HASH, BlockManager, BlockTable

NUM_BLOCKS, BLOCK = 12, 2
bits = st.lists(st.integers(0, 1), max_size=9)  # a tiny vocabulary, so prefixes repeat often
few_bits = st.lists(st.integers(0, 1), max_size=3)


@dataclass
class Request:
    table: BlockTable
    tokens: list[int]
    computed: int


class BlockManagerMachine(RuleBasedStateMachine):
    """Drives a `BlockManager` like an engine, keeping a shadow KV cache: ``kv[block][offset]`` is the
    token prefix whose last token's KV was written there (what real KV depends on). Reusing a block whose
    KV came from another prefix, or writing a block another table still reads, shows up as a mismatch."""

    prefix_caching = True
    hash_fn = staticmethod(block_manager.block_hash)

    def __init__(self) -> None:
        super().__init__()
        self.saved_hash, block_manager.block_hash = block_manager.block_hash, self.hash_fn
        self.manager = BlockManager(NUM_BLOCKS, BLOCK, enable_prefix_caching=self.prefix_caching)
        self.kv: list[list[tuple[int, ...] | None]] = [[None] * BLOCK for _ in range(NUM_BLOCKS)]
        self.requests: dict[int, Request] = {}
        self.next_id = 0
        self.history: list[list[int]] = []  # computed token sequences, to draw repeated prompts from

    def teardown(self) -> None:
        try:
            for request in self.requests.values():
                self.manager.free(request.table)
            self.manager.check_invariants()
            assert self.manager.num_free_blocks == NUM_BLOCKS, "blocks leaked"
        finally:
            block_manager.block_hash = self.saved_hash

    def snapshot(self) -> tuple[object, ...]:
        m = self.manager
        refs = tuple(m.ref_count(b) for b in range(NUM_BLOCKS))
        return m.num_free_blocks, m.prefix_cache_queried_tokens, m.prefix_cache_hit_tokens, refs

    def pick(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.requests)))

    @rule(prompt=bits, use_cache=st.booleans())
    def new_request(self, prompt: list[int], use_cache: bool) -> None:
        before, table = self.snapshot(), BlockTable()
        cached = self.manager.allocate_prompt(table, prompt, use_cache=use_cache)
        if cached is None:
            assert table == BlockTable() and self.snapshot() == before
            return
        assert len(table.blocks) == self.manager.blocks_for(len(prompt))
        assert cached % BLOCK == 0 and cached <= max(0, len(prompt) - 1) and len(table.hashes) == cached // BLOCK
        assert cached == 0 or (use_cache and self.prefix_caching)
        for p in range(cached):
            assert self.kv[table.blocks[p // BLOCK]][p % BLOCK] == tuple(prompt[: p + 1]), "wrong KV reused"
        self.requests[self.next_id] = Request(table, list(prompt), cached)
        self.next_id += 1

    @precondition(lambda self: self.history)
    @rule(data=st.data(), suffix=few_bits)
    def repeat_request(self, data: st.DataObject, suffix: list[int]) -> None:
        """A prompt sharing a prefix with tokens computed earlier: the case prefix caching is for."""
        past = data.draw(st.sampled_from(self.history))
        self.new_request(past[: data.draw(st.integers(0, len(past)))] + suffix, use_cache=True)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), new_tokens=few_bits, chunk=st.integers(1, 5), register=st.booleans())
    def compute(self, data: st.DataObject, new_tokens: list[int], chunk: int, register: bool) -> None:
        """Append tokens (decode), compute the next chunk and maybe register it (or at a later step)."""
        request = self.requests[self.pick(data)]
        request.tokens += new_tokens
        self.forward(request, min(len(request.tokens), request.computed + chunk), register)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), count=st.integers(1, 3), new_tokens=st.lists(st.integers(0, 1), min_size=1, max_size=3))
    def rewrite(self, data: st.DataObject, count: int, new_tokens: list[int]) -> None:
        """Discard the last computed tokens and compute others in their place (rejected speculative tokens)."""
        request = self.requests[self.pick(data)]
        request.computed = max(0, request.computed - count)
        request.tokens[request.computed :] = new_tokens
        self.forward(request, len(request.tokens), register=True)

    def forward(self, request: Request, end: int, register: bool) -> None:
        """Compute positions ``request.computed..end-1`` into the shadow KV cache, as a forward would."""
        start, blocks, before = request.computed, list(request.table.blocks), self.snapshot()
        copies = self.manager.prepare_write(request.table, start, end)
        if copies is None:
            assert request.table.blocks == blocks and self.snapshot() == before
            return
        sources, targets = {src for src, _ in copies}, [dst for _, dst in copies]
        assert len(set(targets)) == len(targets) and not sources & set(targets)
        for src, dst in copies:
            self.kv[dst] = list(self.kv[src])
        assert len(request.table.blocks) >= self.manager.blocks_for(end)
        for p in range(start, end):
            block = request.table.blocks[p // BLOCK]
            assert self.manager.ref_count(block) == 1, "writing a shared block"
            self.kv[block][p % BLOCK] = tuple(request.tokens[: p + 1])
        request.computed = end
        self.history.append(request.tokens[:end])
        if register:
            self.manager.register_computed(request.table, request.tokens, end)
            assert self.prefix_caching or request.table.hashes == []

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        request = self.requests[self.pick(data)]
        self.requests[self.next_id] = Request(self.manager.fork(request.table), list(request.tokens), request.computed)
        self.next_id += 1

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        table = self.requests.pop(self.pick(data)).table
        self.manager.free(table)
        assert table == BlockTable()

    @rule()
    def reset_prefix_cache(self) -> None:
        self.manager.reset_prefix_cache()

    @invariant()
    def consistent(self) -> None:
        self.manager.check_invariants()
        holders = Counter(b for request in self.requests.values() for b in request.table.blocks)
        assert [self.manager.ref_count(b) for b in range(NUM_BLOCKS)] == [holders[b] for b in range(NUM_BLOCKS)]
        assert self.manager.num_free_blocks == NUM_BLOCKS - len(holders)
        for request in self.requests.values():
            table, tokens = request.table, request.tokens
            for p in range(request.computed):
                assert self.kv[table.blocks[p // BLOCK]][p % BLOCK] == tuple(tokens[: p + 1]), "KV overwritten"
            chain = ROOT_HASH
            for i in range(min(len(table.hashes), request.computed // BLOCK)):
                chain = block_manager.block_hash(chain, tuple(tokens[i * BLOCK : (i + 1) * BLOCK]))
                assert table.hashes[i] == chain, "bad hash chain"


class NoPrefixCachingMachine(BlockManagerMachine):
    prefix_caching = False


class CollidingHashMachine(BlockManagerMachine):
    """A 3-valued hash blind to the prefix: equal blocks after different prefixes always collide."""

    hash_fn = staticmethod(lambda parent_hash, token_ids: hash(token_ids) % 3)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestNoPrefixCachingMachine = NoPrefixCachingMachine.TestCase
TestNoPrefixCachingMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)
TestCollidingHashMachine = CollidingHashMachine.TestCase
TestCollidingHashMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
