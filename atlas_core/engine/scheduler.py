"""Continuous batching with chunked prefill and preemption (by recompute, or by swap to the storage tiers).

Each step has a token budget (``max_num_batched_tokens``). The scheduler fills it in order:

1. one token for every running sequence that is decoding (with speculative decoding, plus room for
   its draft tokens when the budget and free blocks allow it; drafts never preempt; a sequence that
   recomputes its generated tokens after preemption gets that room too). When a decode
   needs a KV block and none is free, the most recently admitted running sequence is preempted: its
   blocks and state slot are freed and it goes back to the front of the queue, to be recomputed later;
2. the next chunk (at most ``max_prefill_tokens``) of running sequences whose prefill is
   unfinished;
3. new sequences from the queue, while ``max_num_seqs`` and free KV blocks allow (a prompt's
   blocks are all allocated on admission, reusing prefix-cached blocks).

Recurrent (hybrid) models: each running sequence holds a state slot; a request's first sequence
also reserves the slots of its n - 1 forks on admission. With state snapshots (`StateSnapshots`), a
prefill chunk is cut at the last block boundary before the sequence's last known token, the state
there is saved after the forward (`snapshot_state`), and a cached prefix is reused only up to a
boundary whose state was saved; the snapshot is restored into the new sequence's slot on admission.

Policies: ``fifo`` admits in arrival order. ``slo`` admits the shortest prompt first and, when a
decoding sequence has waited longer than ``0.8 * tbt_slo_s`` since its last token, runs a
decode-only step so that no prefill chunk delays it further.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from atlas_core.backends.ops.checkpoints import CHECKPOINTED_TOKENS
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.config import SchedulingPolicy
from atlas_core.engine.kv_offload import KVOffload
from atlas_core.engine.runner import ScheduledChunk
from atlas_core.engine.sequence import Sequence, SequenceStatus
from atlas_core.engine.state_slots import StateSlotPool, StateSnapshots

SLO_MARGIN = 0.8


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's part of `EngineConfig` (whose construction checks the values)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_prefill_tokens: int
    policy: SchedulingPolicy = "fifo"
    tbt_slo_s: float = 0.1


@dataclass
class ScheduledStep:
    """What to run: chunks, KV block copies to apply first (copy-on-write; all sources are read
    before any destination is written), and who was preempted."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        state_slots: StateSlotPool | None,
        snapshots: StateSnapshots | None = None,
        draft_room: Callable[[Sequence], int] | None = None,
        offload: KVOffload | None = None,
    ) -> None:
        """``draft_room(seq)``: with speculative decoding, how many draft tokens a decoding sequence may
        verify in a step (0: none)."""
        self.config = config
        self.draft_room = draft_room
        self.blocks = blocks
        self.state_slots = state_slots
        self.snapshots = snapshots
        self.offload = offload  # storage tiers: preemption by swap, prefix-cache spill
        self._decode_snapshots: dict[
            Sequence, int
        ] = {}  # content id of each sequence's latest snapshot past its prompt
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        if self.offload is not None:
            self.offload.poll()  # sequences whose KV came back from the storage tiers may run now
        step = ScheduledStep()
        copies: dict[Sequence, list[tuple[int, int]]] = {}
        budget = self.config.max_num_batched_tokens
        for seq in [s for s in self.running if s.is_decoding and not self._loading(s)]:
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            room = self._draft_room(seq, budget - 1, copies)
            if room or self._reserve(seq, 1, step, copies):
                step.chunks.append(ScheduledChunk(seq, 1, draft_room=room))
                budget -= 1 + room
        if self._decode_only():
            step.block_copies = [pair for pairs in copies.values() for pair in pairs]
            return step
        for seq in [s for s in self.running if not s.is_decoding and not self._loading(s)]:
            if budget <= 0:
                break
            count = self._prefill_chunk(seq, budget)
            # a sequence resuming its generation (recomputing after preemption) verifies drafts behind its known
            # tokens in the same step
            resumes = count == seq.num_uncomputed and bool(seq.output_ids)
            room = self._draft_room(seq, budget - count, copies, count) if resumes else 0
            if room or self._reserve(seq, count, step, copies):
                step.chunks.append(ScheduledChunk(seq, count, draft_room=room))
                budget -= count + room
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._next_waiting()
            if not self._admit(seq):
                break
            if self._loading(seq):
                continue
            count = self._prefill_chunk(seq, budget)
            step.chunks.append(ScheduledChunk(seq, count))
            budget -= count
        step.block_copies = [pair for pairs in copies.values() for pair in pairs]
        return step

    def _loading(self, seq: Sequence) -> bool:
        """True while ``seq``'s KV is coming back from the storage tiers: it is not scheduled yet."""
        return self.offload is not None and self.offload.is_loading(seq)

    def _reserve(
        self, seq: Sequence, count: int, step: ScheduledStep, copies: dict[Sequence, list[tuple[int, int]]]
    ) -> bool:
        """Make room to write ``count`` tokens of ``seq``, preempting others (or ``seq``) if needed.

        Copy-on-write copies are recorded per sequence, so a preempted sequence's copies (whose
        targets it just freed) are dropped with it.
        """
        while True:
            needed = self.blocks.prepare_write(seq.table, seq.num_computed, seq.num_computed + count)
            if needed is not None:
                copies.setdefault(seq, []).extend(needed)
                return True
            victim = self.running[-1]
            self.preempt(victim, copies.pop(victim, []))
            step.preempted.append(victim)
            step.chunks[:] = [chunk for chunk in step.chunks if chunk.seq is not victim]
            if victim is seq:
                return False

    def reserve_next_block(self, seq: Sequence) -> bool:
        """Give the decoding ``seq`` now the fresh KV block that its next position (``num_computed``, the first of a
        block) starts, which the next `schedule` would give it (`BlockManager.prepare_write`, which then finds it
        there): a decode step queued ahead writes that position before the scheduler runs
        (`atlas_core.engine.ahead`). False, changing nothing, when no block is free (the scheduler then makes
        room as usual)."""
        position = seq.num_computed
        assert position == len(seq.table.blocks) * self.blocks.block_size  # the block's first position
        return self.blocks.prepare_write(seq.table, position, position + 1) is not None

    def _draft_room(
        self, seq: Sequence, budget: int, copies: dict[Sequence, list[tuple[int, int]]], count: int = 1
    ) -> int:
        """Speculative decoding: make room for ``count`` tokens of ``seq`` (its decode token, or the rest of
        its known tokens) and up to ``draft_room(seq)`` (at most ``budget``) draft tokens behind them,
        without preempting anyone; how many drafts fit (0: none, and nothing reserved). On models with recurrent
        state the tokens and drafts together stay under `CHECKPOINTED_TOKENS` (the ops checkpoint the state of
        each draft position only in such sequences)."""
        room = min(self.draft_room(seq), budget) if self.draft_room is not None else 0
        if self.state_slots is not None:  # recurrent layers checkpoint the drafts of short sequences only
            room = min(room, CHECKPOINTED_TOKENS - 1 - count)
        if room < 1 or self.blocks.num_free_blocks < len(self.running):  # keep a block for each decoder
            return 0
        needed = self.blocks.prepare_write(seq.table, seq.num_computed, seq.num_computed + count + room)
        if needed is None:
            return 0
        copies.setdefault(seq, []).extend(needed)
        return room

    def _prefill_chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens of ``seq``'s prefill to run now; a chunk never runs past the sequence's snapshot boundary
        and never ends inside an image that attends to itself bidirectionally (it stops before the image,
        or takes all of it when it starts there, even past ``budget``: the step's budget then goes negative
        and the loops stop). No model has both (bidirectional images are Gemma's, recurrent state the
        hybrids'); if one did, the image would win and that boundary's snapshot would be skipped."""
        count = min(seq.num_uncomputed, self.config.max_prefill_tokens, budget)
        boundary = self._snapshot_boundary(seq)
        if boundary is not None and seq.num_computed < boundary < seq.num_computed + count:
            count = boundary - seq.num_computed
        images = seq.request.images
        return count if images is None else images.chunk_tokens(seq.num_computed, count)

    def _snapshot_boundary(self, seq: Sequence) -> int | None:
        """Where ``seq``'s recurrent state is saved: the last block boundary before its last known token
        (None: no snapshots for it)."""
        if self.snapshots is None or seq.request.prompt_logprobs is not None:
            return None
        size = self.blocks.block_size
        return (len(seq.token_ids) - 1) // size * size

    def snapshot_state(self, seq: Sequence) -> None:
        """After a forward (and `BlockManager.register_computed`): save ``seq``'s recurrent state if it
        stands at its snapshot boundary. Past the prompt (decode), a sequence keeps only its latest one."""
        boundary = self._snapshot_boundary(seq)
        if not boundary or seq.num_computed != boundary or seq.state_slot is None or self.snapshots is None:
            return
        key = self.blocks.prefix_content(seq.table, boundary // self.blocks.block_size)
        if key is None:
            return
        block_hash, content = key
        self.snapshots.save(content, block_hash, seq.state_slot)
        if boundary >= seq.num_prompt_tokens:
            previous = self._decode_snapshots.get(seq)
            if previous is not None and previous != content:
                self.snapshots.discard(previous)
            self._decode_snapshots[seq] = content

    def _decode_only(self) -> bool:
        if self.config.policy != "slo":
            return False
        deadline = time.monotonic() - SLO_MARGIN * self.config.tbt_slo_s
        return any(seq.is_decoding and seq.last_token_time < deadline for seq in self.running)

    def _next_waiting(self) -> Sequence:
        if self.config.policy == "slo":
            return min(self.waiting, key=lambda s: len(s.token_ids))
        return self.waiting[0]

    def _admit(self, seq: Sequence) -> bool:
        """Allocate blocks (and state slots) for a waiting sequence; False if there is no room.

        Recurrent models: the first sequence of a request also reserves its pending forks' slots, and a
        cached prefix is reused only up to a boundary with a state snapshot, restored into the new slot.
        With storage tiers, a swapped-out sequence's KV, or spilled blocks extending its prefix hit, start
        loading: the sequence is admitted but not scheduled until they are in (`KVOffload.is_loading`)."""
        slots = self.state_slots
        needs_slot = [seq, *(f for f in seq.request.pending_forks if f.state_slot is None)] if slots is not None else []
        if slots is not None and slots.num_free < len(needs_slot):
            return False
        snapshots = self.snapshots if slots is not None else None
        offload = self.offload
        swapped = offload is not None and offload.is_swapped(seq)
        use_cache = not swapped and not seq.request.needs_every_position and (slots is None or snapshots is not None)
        reusable = snapshots.__contains__ if snapshots is not None else None
        cached = self.blocks.allocate_prompt(seq.table, seq.cache_ids, use_cache=use_cache, reusable=reusable)
        if cached is None:
            return False
        if slots is not None:
            for owner in needs_slot:
                owner.state_slot = slots.allocate()
            if cached and snapshots is not None:
                key = self.blocks.prefix_content(seq.table, cached // self.blocks.block_size)
                assert key is not None  # allocate_prompt files every reused block's hash in the table
                snapshots.restore(key[1], seq.held_state_slot())
        if offload is not None and swapped:
            offload.start_swap_in(seq)  # num_computed is set when the KV is back
        elif offload is not None and use_cache:
            offload.start_prefix_load(seq, cached)  # spilled blocks past the device hit
        self.waiting.remove(seq)
        if seq.counts_cached_tokens and not swapped:
            seq.request.num_cached_tokens = cached
        seq.num_computed = cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def start_fork(self, parent: Sequence, child: Sequence) -> None:
        """Run ``child`` from now on, sharing ``parent``'s blocks (n > 1 completions)."""
        child.table = self.blocks.fork(parent.table)
        child.num_computed = parent.num_computed
        child.status = SequenceStatus.RUNNING
        self.running.append(child)

    def preempt(self, seq: Sequence, pending_copies: list[tuple[int, int]] | None = None) -> None:
        """Free everything ``seq`` holds and queue it again. With swapping, its KV (and state) go to the
        storage tiers first and come back on readmission; otherwise it is recomputed from its tokens. A load
        from the tiers still in flight is cancelled (a swapped sequence keeps its records).
        ``pending_copies``: its copy-on-write copies of this step, not applied yet."""
        if self.offload is not None and not self.offload.cancel_load(seq):
            self.offload.swap_out(seq, pending_copies or [])
        self._release_resources(seq)
        self.running.remove(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def release(self, seq: Sequence) -> None:
        """Forget a finished or aborted sequence and free its blocks and state slot."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if self.offload is not None:
            self.offload.forget(seq)
        self._release_resources(seq)

    def _release_resources(self, seq: Sequence) -> None:
        self._decode_snapshots.pop(seq, None)
        self.blocks.free(seq.table)
        if seq.state_slot is not None and self.state_slots is not None:
            self.state_slots.free(seq.state_slot)
            seq.state_slot = None
