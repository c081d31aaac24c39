"""The next decode step's inputs, prepared while the device runs the current one.

Between two decode steps the device waits for the host: the sampled tokens come back, the engine keeps its
books, schedules, builds the next batch's metadata and uploads it. Most of that batch is known before the
tokens are: when every sequence of a pure-decode step goes on decoding, the next step runs the same
sequences, each at the next position, in the same KV blocks (plus a new one where the token starts one).
`DecodeLookahead.prepare` builds those inputs and uploads them (ordered after the running step on the
device's stream) while the step's forward runs; the step's sampled tokens, still on the device, are the next
step's token ids. `take` hands the
prepared batch to the next step when its chunks are exactly the predicted ones, and None otherwise (a
sequence finished or joined, other KV blocks, drafts, forks, images, forced tokens): that step builds its
batch as usual. The prepared batch holds the same values as one built afresh, so the outputs are too.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import slot_of
from atlas_core.engine.sequence import Sequence

if TYPE_CHECKING:
    from atlas_core.engine.runner import ScheduledChunk


@dataclass
class Prediction:
    """The next step as predicted: its sequences in batch order, each one's position, blocks and state slot,
    and the metadata (host arrays without the token ids, and their device copies)."""

    seqs: list[Sequence]
    positions: list[int]
    blocks: list[list[int]]
    state_slots: list[int]
    host: tuple[np.ndarray, ...]
    device: list[Array]
    tokens: Array | None = None  # the running step's sampled tokens, on the device (`sampled`)

    def decodes(self, chunk: ScheduledChunk, row: int) -> bool:
        """Whether ``chunk`` decodes one token of sequence ``row`` at its predicted position, in its state slot,
        with the token the running step samples appended since (its blocks are the caller's to compare)."""
        seq = chunk.seq
        position = self.positions[row]
        return (
            chunk.seq is self.seqs[row]
            and chunk.num_tokens == 1
            and not chunk.draft
            and not chunk.followers
            and seq.num_computed == position
            and len(seq.token_ids) == position + 1
            and (-1 if seq.state_slot is None else seq.state_slot) == self.state_slots[row]
        )


class DecodeLookahead:
    """Predicts, prepares and hands over the next pure-decode batch (see the module's docstring)."""

    def __init__(self, backend: Backend, block_size: int) -> None:
        self.backend, self.block_size = backend, block_size
        self._next: Prediction | None = None
        self.hits = 0
        """Steps that ran the prepared batch."""

    def prepare(self, chunks: Seq[ScheduledChunk]) -> None:
        """After the forward of ``chunks`` was launched (and each sequence's ``num_computed`` advanced): prepare the
        step in which each of them decodes its next token, if the step is one that can be predicted. A sequence
        whose next token starts a new KV block gets the block the scheduler gives it (`take`)."""
        self._next = None
        bs = self.block_size
        seqs, positions, blocks, state_slots = [], [], [], []
        for chunk in chunks:
            seq = chunk.seq
            position = seq.num_computed
            if (
                chunk.num_tokens != 1
                or chunk.draft
                or chunk.followers
                or len(seq.token_ids) != position  # this step samples the token at ``position``
                or seq.request.images is not None
                or seq.request.pooler is not None
                or position // bs > len(seq.table.blocks)
            ):
                return
            seqs.append(seq)
            positions.append(position)
            blocks.append(list(seq.table.blocks))
            state_slots.append(-1 if seq.state_slot is None else seq.state_slot)
        if not seqs:
            return
        count = len(seqs)
        width = max(max(len(table), p // bs + 1) for table, p in zip(blocks, positions, strict=True))
        tables = np.full((count, width), -1, dtype=np.int32)
        slots = np.full(count, -1, dtype=np.int32)
        for row, (table, position) in enumerate(zip(blocks, positions, strict=True)):
            tables[row, : len(table)] = table
            if position // bs < len(table):  # else: a new block, filled in by `take`
                slots[row] = slot_of(table, bs, position)
        at = np.asarray(positions, dtype=np.int32)
        host = (at, np.arange(count + 1, dtype=np.int32), at + 1, tables, slots, np.asarray(state_slots, np.int32))
        self._next = Prediction(seqs, positions, blocks, state_slots, host, self.backend.upload_int32(host))

    def sampled(self, tokens: Array | None) -> None:
        """The running step's sampled tokens (one per sequence, in batch order, on the device), which are the
        next step's token ids; None when some were not sampled there (forced by a grammar): no next batch."""
        prediction = self._next
        if prediction is not None:
            usable = (
                tokens is not None
                and type(tokens) is type(prediction.device[0])  # the backend's own arrays, as its uploads are
                and getattr(tokens, "dtype", None) == np.int32
                and tokens.shape == (len(prediction.seqs),)
                and bool(getattr(getattr(tokens, "flags", None), "c_contiguous", False))
            )
            if usable:
                prediction.tokens = tokens
            else:
                self._next = None

    def take(self, chunks: Seq[ScheduledChunk]) -> ForwardBatch | None:
        """The prepared batch when ``chunks`` are exactly the predicted step (a sequence may have got the one new
        block its token needs), else None; either way the prediction is used up."""
        prediction, self._next = self._next, None
        if prediction is None or prediction.tokens is None or len(chunks) != len(prediction.seqs):
            return None
        bs = self.block_size
        grown: list[int] = []  # rows whose token starts a new block
        for row, (chunk, position, table) in enumerate(
            zip(chunks, prediction.positions, prediction.blocks, strict=True)
        ):
            blocks = chunk.seq.table.blocks
            if not prediction.decodes(chunk, row):
                return None
            if position // bs >= len(blocks):  # no block for the token (a fresh build would fail loudly too)
                return None
            if len(blocks) != len(table):  # the token starts a block: only that one may be new
                if position // bs != len(table) or len(blocks) != len(table) + 1 or blocks[:-1] != table:
                    return None
                grown.append(row)
            elif blocks != table:
                return None
        ids = np.asarray([seq.token_ids[-1] for seq in prediction.seqs], dtype=np.int32)
        self._add_blocks(prediction, grown)
        return self._batch(prediction, ids)

    def take_ahead(
        self, admits: Callable[[list[Sequence]], bool], reserve: Callable[[Sequence], bool] | None
    ) -> tuple[Prediction, ForwardBatch] | None:
        """The prepared batch before the running step's tokens are read (`atlas_core.engine.ahead`): the prediction
        and the batch, whose input ids are those tokens on the device. ``admits(seqs)``: whether the predicted
        sequences may run ahead; ``reserve(seq)``: gives a sequence the KV block its token starts
        (`Scheduler.reserve_next_block`), None where none may be given ahead. None, leaving the prediction to `take`,
        when nothing is prepared, ``admits`` refuses, or a sequence's new block cannot be had; else the prediction
        is used up."""
        prediction = self._next
        if prediction is None or prediction.tokens is None or not admits(prediction.seqs):
            return None
        missing = np.flatnonzero(prediction.host[4] < 0).tolist()
        reserved = []
        for row in missing:
            if reserve is None or not reserve(prediction.seqs[row]):  # `take` finds the blocks given so far
                break
            reserved.append(row)
        self._add_blocks(prediction, reserved)
        if len(reserved) < len(missing):
            return None
        self._next = None
        return prediction, self._batch(prediction, None)

    def _add_blocks(self, prediction: Prediction, rows: list[int]) -> None:
        """Enter into ``prediction`` the new KV block that the token of each of ``rows`` starts (the last of its
        sequence's table): its table entry and KV slot, uploaded again."""
        if not rows:
            return
        bs = self.block_size
        host_tables, host_slots = prediction.host[3], prediction.host[4]
        for row in rows:
            blocks, position = prediction.seqs[row].table.blocks, prediction.positions[row]
            host_tables[row, position // bs] = blocks[-1]
            host_slots[row] = slot_of(blocks, bs, position)
            prediction.blocks[row] = list(blocks)
        prediction.device[3:5] = self.backend.upload_int32([host_tables, host_slots])

    def _batch(self, prediction: Prediction, ids: np.ndarray | None) -> ForwardBatch:
        """The prepared batch; ``ids``: the tokens on the host, when they are known there (None: on the device
        only, and so in its ``host_inputs``)."""
        assert prediction.tokens is not None  # `take` and `take_ahead` hand over predictions with tokens only
        positions, starts, lengths, tables, slots, state_slots = prediction.device
        self.hits += 1
        return ForwardBatch(
            input_ids=prediction.tokens,
            positions=positions,
            attention=AttentionMetadata(
                query_start_loc=starts, seq_lens=lengths, block_tables=tables, slot_mapping=slots
            ),
            logits_rows=np.arange(len(prediction.seqs), dtype=np.int64),
            state_slots=state_slots,
            is_pure_decode=True,
            host_inputs=(ids, *prediction.host),
        )
