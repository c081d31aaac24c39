"""CUDA-graph decode: one captured forward per (batch-size bucket, context-split bucket).

Below ``DIRECT_MIN_BATCH`` the split bucket is a power of two, at least ``MIN_SPLIT_ITEMS / batch
bucket``: a graph's attention work list covers contexts up to that many splits (a token's arithmetic
is fixed by its own position, so empty splits change no bits); larger buckets use direct mode.

Inputs live in fixed device buffers sized for `MAX_BATCH` sequences; a step copies the batch into
them, pads the bucket (context 0, KV slot -1, state slot -1: pad rows read and write nothing) and
replays. Recurrent layers read their sequences' state slots from the buffer as attention reads the
block tables, so hybrid models replay graphs too (their state rows are updated in place). Graphs are
captured lazily, the first time a bucket is needed: an eager warm-up on the capture stream fills a
memory pool of the graph's own with every buffer the forward allocates (with every slot -1, so it
touches no KV and no state), then the same forward is captured with that pool, so nothing is
allocated from the shared pool and the buffers stay owned by the graph. Each graph has its own pool:
one graph's scratch memory must never overlap the logits or the work list that another graph keeps
between replays.
A model whose forward cannot be captured (a host fallback op, say) runs eagerly, with one log line.
Kernels are captured as programmatic launches where the device has them (`launch.py`): in a replay each
kernel's launch overlaps the tail of the one before it.

Steps of several tokens per sequence, as many for each (`ForwardBatch.tokens_per_seq`: speculative
decoding's verify steps, a recompute after preemption, short prefill chunks), replay graphs of
their own, keyed by the exact number of sequences (at most `MAX_VERIFY_SEQS`), the tokens per sequence
and the context splits, at most `MAX_VERIFY_GRAPHS` of them; their inputs have their own buffers, with the
recurrent-state checkpoints of each token for models with recurrent layers (`ForwardBatch.state_checkpoints`, -1
where a step has none). A
model whose multi-token step cannot be captured (MLA, say) runs those steps eagerly.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import numpy as np

from atlas_core.backends.base import AttentionMetadata
from atlas_core.batch.forward_batch import ForwardBatch

log = logging.getLogger("atlas.gb10")

MAX_BATCH_ENV = "ATLAS_CUDA_GRAPH_MAX_BATCH"
ENABLE_ENV = "ATLAS_CUDA_GRAPHS"
MIN_SPLIT_ITEMS = 16
"""Small batch buckets capture at least this many (sequence, context split) attention items: a lone
decode token's attention spreads over 16 blocks per KV head (splits past its context exit at once),
and one graph serves every context up to 16 splits, so a growing context does not re-capture."""
DIRECT_MIN_BATCH = 16
MAX_VERIFY_SEQS = 8
"""Verify steps of at most this many sequences replay graphs (speculation pays most at small batches)."""
MAX_VERIFY_TOKENS = 17
MAX_VERIFY_GRAPHS = 48
"""Multi-token graphs kept at most (each holds logits for all its rows); further shapes run eagerly."""
"""Batch buckets from this size run attention in direct mode (a block per sequence and KV head walks
all its splits): enough blocks to fill the GPU, no workspace, no combine, one graph for every context."""


def graphs_enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


def bucket(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << max(0, (n - 1).bit_length())


class CudaDecodeGraphs:
    """`atlas_core.engine.decode_graphs.DecodeGraphs` on CUDA graphs."""

    def __init__(self, backend: Any, model: Any, kv: Any) -> None:
        cp = backend.cp
        self.backend, self.model, self.kv, self.cp = backend, model, kv, cp
        self.max_batch = int(os.environ.get(MAX_BATCH_ENV, "256"))
        self.table_width = min(kv.num_blocks, math.ceil(model.max_position_embeddings / kv.block_size))
        n = self.max_batch
        self.input_ids = cp.zeros((n,), dtype=np.int32)
        self.positions = cp.zeros((n,), dtype=np.int32)
        self.query_start = cp.arange(n + 1, dtype=np.int32)
        self.seq_lens = cp.zeros((n,), dtype=np.int32)
        self.block_tables = cp.zeros((n, self.table_width), dtype=np.int32)
        self.slot_mapping = cp.full((n,), -1, dtype=np.int32)
        self.state_slots = cp.full((n,), -1, dtype=np.int32)
        # a model that reads the target's hidden states (an MTP step, `atlas_core.model.mtp.MtpStep`)
        hidden_width = int(getattr(model, "input_hidden_size", 0))
        self.input_hidden = backend.zeros((n, hidden_width), backend.activation_dtype) if hidden_width else None
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graphs: dict[tuple[int, int], tuple[Any, Any, Any, Any, Any]] = {}
        self.failed = False
        self.replays = 0
        self.last_hidden: Any = None
        recurrent = bool(getattr(model, "has_recurrent_state", False))
        self.verify = _VerifyBuffers(backend, self.table_width, hidden_width, recurrent)
        self.verify_failed = False
        self.capture_error = ""
        self.verify_graphs: dict[tuple[int, int, int], tuple[Any, ...]] = {}

    def close(self) -> None:
        """Drop every captured graph (and its memory pool); later steps capture again."""
        self.graphs.clear()
        self.verify_graphs.clear()
        self.last_hidden = None

    def can_run(self, batch: ForwardBatch) -> bool:
        num_seqs = batch.attention.seq_lens.shape[0]
        if batch.tokens_per_seq:
            return (
                not self.verify_failed
                and num_seqs <= MAX_VERIFY_SEQS
                and batch.tokens_per_seq <= MAX_VERIFY_TOKENS
                and batch.attention.block_tables.shape[1] <= self.table_width
            )
        return (
            not self.failed
            and num_seqs <= self.max_batch
            and batch.num_tokens == num_seqs
            and batch.attention.block_tables.shape[1] <= self.table_width
        )

    def _key(self, batch: ForwardBatch) -> tuple[int, int]:
        """The (batch bucket, context splits) of the graph that serves a pure-decode ``batch``."""
        size = bucket(batch.attention.seq_lens.shape[0])
        if size >= DIRECT_MIN_BATCH:
            return size, 1  # direct mode: one graph for every context
        width = batch.attention.block_tables.shape[1]  # every context fits in its blocks: no read-back needed
        needed = self.backend.attention_runner.splits_for(width * self.kv.block_size)
        return size, bucket(max(needed, MIN_SPLIT_ITEMS // size))

    def captures(self, batch: ForwardBatch) -> bool:
        if batch.tokens_per_seq:
            return True  # verify steps: their own buckets (not steps queued ahead)
        return not self.failed and self._key(batch) not in self.graphs

    def run(self, batch: ForwardBatch) -> Any:
        if batch.tokens_per_seq:
            return self._run_verify(batch)
        meta = batch.attention
        b = meta.seq_lens.shape[0]
        width = meta.block_tables.shape[1]
        key = self._key(batch)
        size, splits = key
        if key not in self.graphs:
            captured = self._capture(size, splits)
            if captured is None:
                return self._eager(batch)
            self.graphs[key] = captured
        graph, logits, hidden = self.graphs[key][:3]
        self.backend.kernels.function("elementwise", "decode_inputs")(
            (size,),
            (128,),
            (
                batch.input_ids,
                batch.positions,
                meta.seq_lens,
                meta.slot_mapping,
                batch.state_slots,
                meta.block_tables,
                np.int32(width),
                np.int32(b),
                self.input_ids,
                self.positions,
                self.seq_lens,
                self.slot_mapping,
                self.state_slots,
                self.block_tables,
                np.int32(self.table_width),
            ),
        )
        if self.input_hidden is not None:
            self.input_hidden[:b] = batch.input_hidden
        graph.launch(stream=self.cp.cuda.get_current_stream())
        self.replays += 1
        self.last_hidden = hidden[:b]
        return logits[:b]

    def _batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            attention=AttentionMetadata(
                query_start_loc=self.query_start[: size + 1],
                seq_lens=self.seq_lens[:size],
                block_tables=self.block_tables[:size],
                slot_mapping=self.slot_mapping[:size],
            ),
            logits_rows=np.arange(size),
            state_slots=self.state_slots[:size],
            is_pure_decode=True,
            input_hidden=None if self.input_hidden is None else self.input_hidden[:size],
        )

    def _capture(self, size: int, splits: int) -> tuple[Any, Any, Any, Any, Any] | None:
        """(graph, its logits buffer, its final hidden states, its attention work list, its memory pool):
        kept as long as the graph."""
        cp = self.cp
        cp.cuda.Device().synchronize()
        self.seq_lens[:size] = 0  # the warm-up reads no KV and writes none, and no recurrent state
        self.slot_mapping[:size] = -1
        self.state_slots[:size] = -1
        cp.cuda.Device().synchronize()
        captured = self._capture_forward(
            self._batch(size), lambda: self.backend.attention_runner.static_work(size, splits)
        )
        if captured is None:
            self.failed = True
            log.warning("decode graphs disabled for this model, decode runs eagerly: %s", self.capture_error)
            return None
        log.info("captured decode graph: batch bucket %d, %d context splits", size, splits)
        return captured

    def _capture_forward(self, batch: ForwardBatch, make_plan: Any) -> tuple[Any, Any, Any, Any, Any] | None:
        """Warm up, then capture the forward of ``batch`` (its buffers) with the attention plan
        ``make_plan()``: (graph, logits, hidden, plan, pool), or None (``capture_error`` says why)."""
        cp, runner = self.cp, self.backend.attention_runner
        graph = None
        pool = cp.cuda.MemoryPool()
        try:
            with cp.cuda.using_allocator(pool.malloc), self.stream:
                plan = runner.static = make_plan()
                self.model.compute_logits(self.model.forward(batch, self.kv))  # warm-up: kernels, pool blocks
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    with self.backend.kernels.programmatic_launches():
                        hidden = self.model.forward(batch, self.kv)
                        logits = self.model.compute_logits(hidden)
                finally:
                    graph = self.stream.end_capture()
                graph.upload(self.stream)
                self.stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - a forward that cannot be captured runs eagerly
            self.capture_error = f"capture failed ({type(exc).__name__}: {exc})"
            return None
        finally:
            runner.static = None
        return graph, logits, hidden, plan, pool

    def _run_verify(self, batch: ForwardBatch) -> Any:
        """Replay the verify graph of this batch's shape (captured on first use); eager when it cannot be."""
        meta = batch.attention
        b, q = meta.seq_lens.shape[0], batch.tokens_per_seq
        width = meta.block_tables.shape[1]
        splits = bucket(max(self.backend.attention_runner.splits_for(width * self.kv.block_size), MIN_SPLIT_ITEMS // b))
        key = (b, q, splits)
        if key not in self.verify_graphs:
            captured = self._capture_verify(b, q, splits) if len(self.verify_graphs) < MAX_VERIFY_GRAPHS else None
            if captured is None:
                return self._eager(batch)
            self.verify_graphs[key] = captured
        graph, logits, hidden = self.verify_graphs[key][:3]
        self.verify.load(batch, width)
        graph.launch(stream=self.cp.cuda.get_current_stream())
        self.replays += 1
        self.last_hidden = hidden
        return logits

    def _eager(self, batch: ForwardBatch) -> Any:
        """The forward without a graph: every row's logits, its hidden states kept as `last_hidden`."""
        self.last_hidden = self.model.forward(batch, self.kv)
        return self.model.compute_logits(self.last_hidden)

    def _capture_verify(self, b: int, q: int, splits: int) -> tuple[Any, ...] | None:
        self.cp.cuda.Device().synchronize()
        batch = self.verify.warm_up_batch(b, q)
        self.cp.cuda.Device().synchronize()
        captured = self._capture_forward(batch, lambda: self.backend.attention_runner.static_work(b, splits, q))
        if captured is None:
            self.verify_failed = True
            log.info("verify steps of speculative decoding run eagerly for this model: %s", self.capture_error)
            return None
        log.info("captured verify graph: %d sequences x %d tokens, %d context splits", b, q, splits)
        return (*captured, batch.attention.query_start_loc)


class _VerifyBuffers:
    """The fixed inputs of verify graphs: up to `MAX_VERIFY_SEQS` sequences of `MAX_VERIFY_TOKENS` tokens
    (and their hidden-state inputs, for an MTP step; with ``recurrent``, their state checkpoints)."""

    def __init__(self, backend: Any, table_width: int, hidden_width: int, recurrent: bool) -> None:
        tokens, seqs = MAX_VERIFY_SEQS * MAX_VERIFY_TOKENS, MAX_VERIFY_SEQS
        self.cp = cp = backend.cp
        self.input_hidden = backend.zeros((tokens, hidden_width), backend.activation_dtype) if hidden_width else None
        self.input_ids = cp.zeros((tokens,), dtype=np.int32)
        self.positions = cp.zeros((tokens,), dtype=np.int32)
        self.slot_mapping = cp.full((tokens,), -1, dtype=np.int32)
        self.seq_lens = cp.zeros((seqs,), dtype=np.int32)
        self.block_tables = cp.zeros((seqs, table_width), dtype=np.int32)
        self.state_slots = cp.full((seqs,), -1, dtype=np.int32)
        self.state_checkpoints = cp.full((tokens,), -1, dtype=np.int32) if recurrent else None

    def warm_up_batch(self, b: int, q: int) -> ForwardBatch:
        """The batch over the buffers for ``b`` sequences of ``q`` tokens, set for a warm-up that reads
        only block 0 and writes no KV and no state."""
        n = b * q
        self.seq_lens[:b] = q
        self.block_tables[:b] = 0
        self.slot_mapping[:n] = -1
        self.state_slots[:b] = -1
        if self.state_checkpoints is not None:
            self.state_checkpoints[:n] = -1
        return ForwardBatch(
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            attention=AttentionMetadata(
                query_start_loc=self.cp.arange(0, n + 1, q, dtype=np.int32),
                seq_lens=self.seq_lens[:b],
                block_tables=self.block_tables[:b],
                slot_mapping=self.slot_mapping[:n],
            ),
            logits_rows=np.arange(n),
            state_slots=self.state_slots[:b],
            tokens_per_seq=q,
            input_hidden=None if self.input_hidden is None else self.input_hidden[:n],
            state_checkpoints=None if self.state_checkpoints is None else self.state_checkpoints[:n],
        )

    def load(self, batch: ForwardBatch, width: int) -> None:
        """Copy a verify batch's inputs into the buffers (device to device, on the current stream)."""
        meta, n, b = batch.attention, batch.num_tokens, batch.attention.seq_lens.shape[0]
        self.input_ids[:n] = batch.input_ids
        self.positions[:n] = batch.positions
        self.slot_mapping[:n] = meta.slot_mapping
        self.seq_lens[:b] = meta.seq_lens
        self.block_tables[:b, :width] = meta.block_tables
        self.state_slots[:b] = batch.state_slots
        if self.state_checkpoints is not None:
            checkpoints = batch.state_checkpoints
            self.state_checkpoints[:n] = -1 if checkpoints is None else checkpoints
        if self.input_hidden is not None:
            self.input_hidden[:n] = batch.input_hidden
