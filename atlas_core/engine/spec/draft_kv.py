"""Paged KV for model-based proposers: `draft_batch` builds the `ForwardBatch` of a proposer's forward
over block tables (a draft model's own, or the target's for an MTP head whose layers live in the
target's cache), and `DraftKV` is the separate cache and block tables of a draft model."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import AnyKVLayout, KVCache, kv_storage_layouts, plan_kv_cache, slots_for
from atlas_core.engine.block_manager import BlockManager, BlockTable
from atlas_core.engine.sequence import Sequence

if TYPE_CHECKING:
    from atlas_core.engine.decode_graphs import DecodeGraphs


@dataclass
class DraftRows:
    """Rows of one sequence in a proposer forward: ``token_ids`` at positions ``position ..``, writing
    their KV into ``blocks`` (the sequence's block table) and attending to every position before them."""

    blocks: list[int]
    position: int
    token_ids: list[int]


def draft_batch(
    backend: Backend, block_size: int, rows: Seq[DraftRows], input_hidden: Array | None = None
) -> ForwardBatch:
    """The forward over ``rows`` (one entry per sequence, ``input_hidden`` its tokens' hidden states for an
    MTP layer); its logits rows are each entry's last row. Rows of one token each make a pure-decode
    batch, rows of as many tokens each a uniform one (`ForwardBatch.tokens_per_seq`): graphs may run them."""
    positions, slots, starts, seq_lens = [], [], [0], []
    lengths = {len(row.token_ids) for row in rows}
    tables = np.full((len(rows), max(len(row.blocks) for row in rows)), -1, dtype=np.int32)
    for b, row in enumerate(rows):
        end = row.position + len(row.token_ids)
        positions.append(np.arange(row.position, end, dtype=np.int32))
        slots.append(slots_for(row.blocks, block_size, row.position, end))
        tables[b, : len(row.blocks)] = row.blocks
        starts.append(starts[-1] + len(row.token_ids))
        seq_lens.append(end)
    upload = backend.from_numpy
    return ForwardBatch(
        input_ids=upload(np.asarray([token for row in rows for token in row.token_ids], dtype=np.int32)),
        positions=upload(np.concatenate(positions)),
        attention=AttentionMetadata(
            query_start_loc=upload(np.asarray(starts, dtype=np.int32)),
            seq_lens=upload(np.asarray(seq_lens, dtype=np.int32)),
            block_tables=upload(tables),
            slot_mapping=upload(np.concatenate(slots).astype(np.int32)),
        ),
        logits_rows=np.asarray(starts[1:], dtype=np.int64) - 1,
        state_slots=upload(np.full(len(rows), -1, dtype=np.int32)),
        is_pure_decode=lengths == {1},
        tokens_per_seq=lengths.pop() if len(lengths) == 1 and 1 not in lengths else 0,
        input_hidden=input_hidden,
    )


class ProposerModel(Protocol):
    """What a proposer runs: a draft model, or one MTP layer (`atlas_core.model.mtp.MtpStep`)."""

    def forward(self, batch: ForwardBatch, kv: KVCache) -> Array: ...

    def compute_logits(self, hidden: Array) -> Array: ...


def forward_rows(
    backend: Backend, model: ProposerModel, graphs: DecodeGraphs | None, batch: ForwardBatch, kv: KVCache
) -> tuple[Array, Array]:
    """``model`` over ``batch``: (the final hidden states of ``batch.logits_rows``, their logits), by the
    model's captured graphs (``backend.decode_graphs``) when they serve the batch, else eagerly."""
    rows = backend.from_numpy(batch.logits_rows)
    if graphs is not None and (batch.is_pure_decode or batch.tokens_per_seq) and graphs.can_run(batch):
        logits = graphs.run(batch)  # every row's
        if graphs.last_hidden is not None:
            return graphs.last_hidden[rows], logits[rows]
    hidden = model.forward(batch, kv)[rows]
    return hidden, model.compute_logits(hidden)


@dataclass
class DraftTable:
    """One sequence's draft KV: ``table`` holds positions ``0 .. length - 1``."""

    table: BlockTable = field(default_factory=BlockTable)
    length: int = 0


class DraftKV:
    """A draft model's own KV cache and block tables; needs `allocate` before use."""

    def __init__(self, backend: Backend, layouts: Seq[AnyKVLayout], max_seq_len: int) -> None:
        self.backend, self.max_seq_len = backend, max_seq_len
        self.layouts = kv_storage_layouts(list(layouts), "auto", backend)
        self.kv: KVCache | None = None
        self.blocks: BlockManager | None = None
        self.tables: dict[Sequence, DraftTable] = {}

    @property
    def bytes_per_token(self) -> int:
        """Bytes of draft KV per token."""
        return sum(layout.bytes_per_token(self.backend.activation_dtype) for layout in self.layouts)

    def allocate(
        self,
        budget_bytes: int,
        block_size: int,
        max_num_seqs: int,
        source: str,
        more: Callable[[int], str | None] | None = None,
    ) -> None:
        """Allocate the cache from ``budget_bytes`` (`KVCacheTooSmallError` if one sequence of
        ``max_seq_len`` does not fit, proposing ``more``'s setting: `plan_kv_cache`)."""
        dtype = self.backend.activation_dtype
        plan = plan_kv_cache(
            self.layouts, dtype, block_size, budget_bytes, self.max_seq_len, source, max_num_seqs, more
        )
        self.kv = KVCache(self.backend, self.layouts, plan)
        self.blocks = BlockManager(plan.num_blocks, block_size, enable_prefix_caching=False)

    def table(self, seq: Sequence) -> DraftTable:
        """``seq``'s draft table (created empty)."""
        return self.tables.setdefault(seq, DraftTable())

    def reserve(self, draft: DraftTable, end: int) -> bool:
        """Make room for positions up to ``end`` (exclusive) in ``draft``; False when no block is free."""
        if self.blocks is None:
            raise RuntimeError("DraftKV.allocate was not called")
        return self.blocks.prepare_write(draft.table, draft.length, end) is not None

    def batch(self, rows: Seq[DraftRows]) -> ForwardBatch:
        """`draft_batch` over this cache."""
        if self.kv is None:
            raise RuntimeError("DraftKV.allocate was not called")
        return draft_batch(self.backend, self.kv.block_size, rows)

    def release(self, seq: Sequence) -> None:
        """Free ``seq``'s draft KV."""
        draft = self.tables.pop(seq, None)
        if draft is not None and self.blocks is not None:
            self.blocks.free(draft.table)
