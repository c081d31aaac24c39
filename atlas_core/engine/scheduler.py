"""Continuous batching: which sequences run in the next step and how many tokens each.

Policy: running sequences first (decode tokens and unfinished prefill chunks), then new
sequences in arrival order while the per-step token budget, ``max_num_seqs`` and free KV blocks
allow. A prompt longer than the remaining budget is prefilled in chunks over several steps.
A sequence is admitted only when the blocks for its longest possible length are free, so a
running sequence never runs out of KV space.
"""

from __future__ import annotations

from collections import deque

from atlas_core.engine.kv_cache import BlockAllocator
from atlas_core.engine.runner import ScheduledChunk
from atlas_core.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, allocator: BlockAllocator, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def blocks_needed(self, seq: Sequence) -> int:
        return -(-seq.max_len // self.block_size)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        chunks = []
        for seq in self.running:
            count = min(len(seq.token_ids) - seq.num_computed, budget)
            if count > 0:
                chunks.append(ScheduledChunk(seq, count))
                budget -= count
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            needed = self.blocks_needed(seq)
            if needed > self.allocator.num_free:
                break
            self.waiting.popleft()
            seq.blocks = self.allocator.allocate(needed)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            count = min(len(seq.token_ids), budget)
            chunks.append(ScheduledChunk(seq, count))
            budget -= count
        return chunks

    def release(self, seq: Sequence) -> None:
        """Free a finished or aborted sequence's blocks and forget it."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq.blocks)
        seq.blocks = []
