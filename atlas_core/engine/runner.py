"""`ModelRunner`: scheduled chunks -> one `ForwardBatch` -> model forward -> logits -> tokens.

Pure-decode steps (every chunk one decode token) go through the backend's captured decode
graphs when it provides them (`DecodeGraphs`); everything else runs eagerly. Pooling (embedding)
requests sample nothing: their final hidden states go to their `Pooler`, and they finish when
their prompt is complete (`atlas_core.engine.pooling`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache, slots_for
from atlas_core.engine.ahead import AheadQueue
from atlas_core.engine.decode_graphs import DecodeGraphs
from atlas_core.engine.guided_decoding import GuidedDecoding
from atlas_core.engine.images import BatchImages
from atlas_core.engine.logprobs import position_logprobs
from atlas_core.engine.lookahead import DecodeLookahead
from atlas_core.engine.sampling_inputs import logit_adjustments, sampling_tensors
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.proposer import HiddenObserver, HiddenSpan
from atlas_core.engine.spec.verify import DraftCheckpoints, SpeculationStats, accept_sampled
from atlas_core.errors import InvalidRequestError
from atlas_core.model.transformer import TransformerModel
from atlas_core.tokenizer import Tokenizer


@dataclass
class ScheduledChunk:
    """``num_tokens`` of ``seq``'s uncomputed tokens to run this step (a prefill chunk or one decode
    token). ``followers`` are forks of ``seq`` (n > 1) that share this computation and sample
    their own first token from its last row.

    Speculative decoding: ``draft_room`` is how many draft tokens the scheduler made room for (KV
    blocks and token budget) behind a chunk that reaches the sequence's last token (a decode token, or
    a recompute of generated tokens); ``draft`` holds at most that many proposed tokens, run after the
    chunk and verified (`atlas_core.engine.spec.verify`)."""

    seq: Sequence
    num_tokens: int
    followers: list[Sequence] = field(default_factory=list)
    draft_room: int = 0
    draft: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence's known tokens, so a token is sampled."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.token_ids)


@dataclass
class _Rows:
    """Which logits rows belong to which sequence: prompt-logprob rows and sampling rows; and which
    hidden rows go to pooling sequences, and the pooling sequences whose prompt this step completes."""

    prompt_rows: list[tuple[Sequence, int, int, int]] = field(default_factory=list)  # (seq, first row, position, count)
    sample_rows: list[tuple[Sequence, int, list[int]]] = field(default_factory=list)  # (seq, first row, draft)
    pool_rows: list[tuple[Sequence, int, int, int]] = field(default_factory=list)  # (seq, position, hidden row, count)
    pool_finish: list[Sequence] = field(default_factory=list)
    hidden_spans: list[HiddenSpan] = field(default_factory=list)  # each chunk's rows (before drafts)


class ModelRunner:
    """Runs the model over scheduled chunks and appends sampled tokens to their sequences."""

    def __init__(
        self,
        model: TransformerModel,
        backend: Backend,
        kv: KVCache,
        tokenizer: Tokenizer | None,
        decode_graphs: DecodeGraphs | None = None,
        guided: GuidedDecoding | None = None,
        checkpoints: DraftCheckpoints | None = None,
        hidden_observer: HiddenObserver | None = None,
        reserve_next_block: Callable[[Sequence], bool] | None = None,
    ) -> None:
        """``checkpoints``: hybrid models with speculative decoding (the recurrent state at each draft
        position, restored for sequences whose drafts were rejected). ``hidden_observer``: a proposer that
        reads each step's final hidden states (MTP). ``reserve_next_block``: gives a decoding sequence the KV block
        its next token starts, for decode steps queued ahead (`atlas_core.engine.ahead`); None where none may be
        given ahead (models with recurrent state)."""
        self.model, self.backend, self.kv, self.tokenizer = model, backend, kv, tokenizer
        self.decode_graphs = decode_graphs
        self.guided = guided
        self.checkpoints = checkpoints
        self.hidden_observer = hidden_observer
        self.spec_stats = SpeculationStats()
        self._accepted: dict[Sequence, int] = {}
        self.lookahead = DecodeLookahead(backend, kv.block_size) if backend.prepares_decode_steps else None
        """Prepares each pure-decode step's successor while it runs (None: every batch is built afresh). Using it,
        `build_batch` takes up the prepared step."""
        self.ahead = (
            AheadQueue(
                self.lookahead,
                backend,
                self._forward,
                reserve_next_block,
                model.mirror.settle if model.mirror else None,
            )
            if self.lookahead is not None and backend.queues_work and hidden_observer is None
            else None
        )
        """Launches a pure-decode step's successor before the step's tokens are read, on backends that queue
        work (`atlas_core.engine.ahead`); `execute` takes it up."""

    def build_batch(self, chunks: list[ScheduledChunk]) -> tuple[ForwardBatch, _Rows]:
        prepared = self.lookahead.take(chunks) if self.lookahead is not None else None
        if prepared is not None:  # every chunk decodes one token: a row each, sampled
            rows = _Rows()
            for row, chunk in enumerate(chunks):
                rows.hidden_spans.append(HiddenSpan(chunk.seq, row, chunk.seq.num_computed, 1))
                rows.sample_rows.append((chunk.seq, row, chunk.draft))
            return prepared, rows
        ids: list[int] = []
        positions: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        logits_rows: list[int] = []
        state_slots: list[int] = []
        checkpoint_rows: list[int] = []  # hybrid models' verify steps: the state slot after each token
        checkpoints = self.checkpoints if any(chunk.draft for chunk in chunks) else None
        starts, seq_lens = [0], []
        rows = _Rows()
        max_blocks = max(len(c.seq.table.blocks) for c in chunks)
        tables = np.full((len(chunks), max_blocks), -1, dtype=np.int32)
        images = BatchImages(self.model.vision)
        for b, chunk in enumerate(chunks):
            seq, start = chunk.seq, chunk.seq.num_computed
            end = start + chunk.num_tokens
            ids.extend(seq.token_ids[start:end])
            positions.append(images.positions(seq.request.images, start, end, starts[-1]))
            slots.append(slots_for(seq.table.blocks, self.kv.block_size, start, end))
            tables[b, : len(seq.table.blocks)] = seq.table.blocks
            state_slots.append(-1 if seq.state_slot is None else seq.state_slot)
            first_row = starts[-1]
            recorded = seq.request.prompt_logprobs
            if recorded is not None and len(recorded) < seq.num_prompt_tokens and start < seq.num_prompt_tokens:
                # row p predicts position p + 1; record each prompt position once (recompute repeats rows)
                first_position = max(start + 1, len(recorded))
                count = max(0, min(end, seq.num_prompt_tokens - 1) - (first_position - 1))
                rows.prompt_rows.append((seq, len(logits_rows), first_position, count))
                logits_rows.extend(
                    range(first_row + first_position - 1 - start, first_row + first_position - 1 - start + count)
                )
            pooler = seq.request.pooler
            if pooler is not None:
                first, stop = pooler.rows_wanted(start, end)
                if stop > first:
                    rows.pool_rows.append((seq, first, first_row + first - start, stop - first))
                if chunk.samples:
                    rows.pool_finish.append(seq)
            else:
                rows.hidden_spans.append(HiddenSpan(seq, first_row, start, chunk.num_tokens))
            if pooler is None and chunk.samples:
                for target in (seq, *chunk.followers):
                    rows.sample_rows.append((target, len(logits_rows), chunk.draft))
                last = first_row + chunk.num_tokens - 1
                logits_rows.extend(range(last, last + 1 + len(chunk.draft)))
            if chunk.draft:
                ids.extend(chunk.draft)
                positions.append(
                    images.positions(seq.request.images, end, end + len(chunk.draft), first_row + end - start)
                )
                slots.append(slots_for(seq.table.blocks, self.kv.block_size, end, end + len(chunk.draft)))
            if checkpoints is not None:
                checkpoint_rows += checkpoints.rows(seq, chunk.num_tokens, len(chunk.draft))
            starts.append(first_row + chunk.num_tokens + len(chunk.draft))
            seq_lens.append(end + len(chunk.draft))
        host = (
            np.asarray(ids, dtype=np.int32),
            np.concatenate(positions).astype(np.int32, copy=False),
            np.asarray(starts, dtype=np.int32),
            np.asarray(seq_lens, dtype=np.int32),
            tables,
            np.concatenate(slots).astype(np.int32, copy=False),
            np.asarray(state_slots, dtype=np.int32),
        )
        uploads = (*host, np.asarray(checkpoint_rows, dtype=np.int32)) if checkpoints is not None else host
        input_ids, token_positions, query_start, lengths, block_tables, slot_mapping, slot_ids, *checkpoint_slots = (
            self.backend.upload_int32(uploads)
        )
        meta = AttentionMetadata(
            query_start_loc=query_start, seq_lens=lengths, block_tables=block_tables, slot_mapping=slot_mapping
        )
        visible_end = images.visible_end()
        if visible_end is not None:
            meta.visible_end = self.backend.from_numpy(visible_end)
        visual, rope_rows = images.finish(self.backend)
        batch = ForwardBatch(
            input_ids=input_ids,
            positions=token_positions,
            attention=meta,
            logits_rows=np.asarray(logits_rows, dtype=np.int64),
            state_slots=slot_ids,
            is_pure_decode=all(c.num_tokens == 1 and c.seq.is_decoding and not c.draft for c in chunks)
            and not rows.prompt_rows,
            tokens_per_seq=_tokens_per_seq(chunks) if visual is None else 0,
            visual=visual,
            rope_rows=rope_rows,
            host_inputs=host,
            state_checkpoints=checkpoint_slots[0] if checkpoint_slots else None,
        )
        return batch, rows

    def execute(
        self, chunks: list[ScheduledChunk], block_copies: list[tuple[int, int]], run_ahead: bool = False
    ) -> list[Sequence]:
        """Run one step; returns the sequences that received a token. ``run_ahead``: the engine expects the next step
        to decode these chunks' sequences again, so it may be launched before this step's tokens are read
        (`atlas_core.engine.ahead`); a step launched so is taken here when ``chunks`` are its decodes."""
        taken = self.ahead.take(chunks) if self.ahead is not None else None
        if taken is None:
            return self._run(chunks, block_copies, run_ahead)
        assert self.ahead is not None
        self.ahead.advance(taken, chain=run_ahead and not taken.rest)
        sampled: list[Sequence] = []
        if taken.rest:
            sampled = self._run(taken.rest, block_copies, False)
        elif block_copies:
            self.kv.copy_blocks(block_copies)
        seqs = [chunk.seq for chunk in taken.chunks]
        self._give_tokens([(seq, row, []) for row, seq in enumerate(seqs)], self.ahead.tokens(taken), None, None)
        return [*seqs, *sampled]

    def _run(
        self, chunks: list[ScheduledChunk], block_copies: list[tuple[int, int]], run_ahead: bool
    ) -> list[Sequence]:
        """Build, run and sample one step (`execute`, for a step not queued ahead)."""
        if block_copies:
            self.kv.copy_blocks(block_copies)
        batch, rows = self.build_batch(chunks)
        hidden, logits = self._forward(batch)
        for chunk in chunks:
            for seq in (chunk.seq, *chunk.followers):
                seq.num_computed += chunk.num_tokens
        guided = self.guided is not None and self.guided.active
        if self.lookahead is not None and batch.is_pure_decode and logits is not None and not guided:
            self.lookahead.prepare(chunks)  # while the device runs this step
        pooled = self._pool(rows, hidden)
        if logits is None:
            self._observe(hidden, rows)
            return pooled
        want_logprobs = rows.prompt_rows or any(seq.logprobs is not None for seq, _, _ in rows.sample_rows)
        logprobs = self.backend.to_numpy(self.backend.log_softmax(logits)) if want_logprobs else None
        for seq, first, position, count in rows.prompt_rows:
            recorded, top = seq.request.prompt_logprobs, seq.params.prompt_logprobs
            assert logprobs is not None and recorded is not None and top is not None  # why the rows were added
            for i in range(count):
                token = seq.token_ids[position + i]
                recorded.append(position_logprobs(logprobs[first + i], token, top, self.tokenizer))
        sampled = self._sample(rows, logits, logprobs, run_ahead and batch.is_pure_decode)
        self._observe(hidden, rows)
        return [*pooled, *sampled]

    def _observe(self, hidden: Array | None, rows: _Rows) -> None:
        """Show the hidden observer the step's confirmed rows: each chunk's, plus its accepted drafts."""
        if self.hidden_observer is not None and hidden is not None:
            spans = [span._replace(length=span.length + self._accepted.get(span.seq, 0)) for span in rows.hidden_spans]
            self.hidden_observer.observe(hidden, spans)
        self._accepted.clear()

    def _forward(self, batch: ForwardBatch) -> tuple[Array | None, Array | None]:
        """``(final hidden states, logits of batch.logits_rows)``; a captured graph, when one fits,
        gives the hidden states its backend keeps (`DecodeGraphs.last_hidden`); no logits rows, no logits."""
        graphs = self.decode_graphs
        if (batch.is_pure_decode or batch.tokens_per_seq) and graphs is not None and graphs.can_run(batch):
            logits = graphs.run(batch)  # every row's
            rows = batch.logits_rows
            if len(rows) != logits.shape[0] or not np.array_equal(rows, np.arange(len(rows))):
                logits = logits[self.backend.from_numpy(rows)]
            return graphs.last_hidden, logits
        hidden = self.model.forward(batch, self.kv)
        if len(batch.logits_rows) == 0:
            return hidden, None
        return hidden, self.model.compute_logits(hidden[self.backend.from_numpy(batch.logits_rows)])

    def _pool(self, rows: _Rows, hidden: Array | None) -> list[Sequence]:
        """Hand pooling sequences their hidden rows; finish those whose prompt is complete."""
        if rows.pool_rows:
            assert hidden is not None  # pooling chunks are prefill, never a captured decode graph
            indices = np.concatenate([np.arange(row, row + count) for _, _, row, count in rows.pool_rows])
            states = self.backend.to_numpy(hidden[self.backend.from_numpy(indices)])
            offset = 0
            for seq, position, _, count in rows.pool_rows:
                assert seq.request.pooler is not None  # why the rows were added
                seq.request.pooler.add(position, states[offset : offset + count])
                offset += count
        for seq in rows.pool_finish:
            seq.finish("stop")
        return rows.pool_finish

    def _sample(self, rows: _Rows, logits: Array, logprobs: np.ndarray | None, run_ahead: bool) -> list[Sequence]:
        """Sample every sampling row (a verified chunk has one per draft token and one more), then give
        each sequence its tokens: one, or those `accept_sampled` keeps. ``run_ahead``: a pure-decode step whose
        successor the engine expects (`execute`)."""
        if not rows.sample_rows:
            return []
        seqs, offsets, row_list, drafted = [], [], [], []
        for seq, row, draft in rows.sample_rows:
            for offset in range(len(draft) + 1):
                seqs.append(seq)
                offsets.append(offset)
                row_list.append(row + offset)
                drafted.append(draft[:offset])  # the tokens before this row's, if the drafts are kept
        indices = np.asarray(row_list)
        if len(indices) != logits.shape[0] or not np.array_equal(indices, np.arange(len(indices))):
            logits = logits[self.backend.from_numpy(indices)]
        guided = self.guided if self.guided is not None and self.guided.active else None
        forced = guided.forced_tokens(seqs) if guided else {}
        bans = guided.banned_tokens(seqs, skip=forced, drafted=drafted) if guided else None
        adjustments = logit_adjustments(seqs, bans, drafted)
        if adjustments is not None:  # logprobs above are of the unadjusted distribution
            self.backend.adjust_logits(logits, adjustments)
        sampled = self.backend.sample(logits, sampling_tensors(seqs, offsets))
        if self.lookahead is not None:
            self.lookahead.sampled(None if forced else sampled)
        ahead = run_ahead and not guided and adjustments is None and len(seqs) == len(rows.sample_rows)
        tokens = (
            self.ahead.read(sampled) if ahead and self.ahead is not None else self.backend.to_numpy(sampled).tolist()
        )
        for row, token in forced.items():
            tokens[row] = token
        self._give_tokens(rows.sample_rows, tokens, indices, logprobs)
        return list(dict.fromkeys(seqs))

    def _give_tokens(
        self,
        sample_rows: list[tuple[Sequence, int, list[int]]],
        tokens: list[int],
        indices: np.ndarray | None,
        logprobs: np.ndarray | None,
    ) -> None:
        """Give each sampling row's sequence its sampled tokens (``tokens`` in row order, one per row and draft
        token): one, or those `accept_sampled` keeps. ``indices``: the logits row of each token (for logprobs)."""
        guided = self.guided if self.guided is not None and self.guided.active else None

        def record(seq: Sequence, row: int, i: int, token: int) -> None:
            """Give ``seq`` its ``i``-th token of the step, sampled in logits row ``indices[row] + i``."""
            if guided:
                guided.accept(seq, token)
            if seq.logprobs is not None:
                top = seq.params.logprobs
                assert logprobs is not None and top is not None  # a sequence records logprobs when asked to
                assert indices is not None  # logprobs come with their rows
                entry = position_logprobs(logprobs[int(indices[row]) + i], token, top, self.tokenizer)
                seq.cumulative_logprob += entry[token].logprob
                seq.logprobs.append(entry)
            seq.append_token(token)

        try:
            first = 0
            for seq, _, draft in sample_rows:
                span = slice(first, first + len(draft) + 1)
                first = span.stop
                try:
                    if not draft and guided is None and seq.logprobs is None:  # one token, nothing else to record
                        seq.append_token(tokens[span.start])
                        continue
                    accepted = accept_sampled(seq, draft, tokens[span], partial(record, seq, span.start))
                except Exception as exc:  # one request's failure (e.g. detokenizing) never stops the batch
                    seq.request.fail(f"{type(exc).__name__}: {exc}", invalid=isinstance(exc, InvalidRequestError))
                    continue
                if draft:
                    self.spec_stats.record(len(draft), accepted)
                    self._accepted[seq] = accepted
                    seq.num_computed += accepted
                    if self.checkpoints is not None and accepted < len(draft) and not seq.finished:
                        self.checkpoints.keep(seq, accepted)
        finally:  # the step's rollbacks run whatever happened, before the next forward reads the slots
            if self.checkpoints is not None:
                self.checkpoints.apply()


def _tokens_per_seq(chunks: list[ScheduledChunk]) -> int:
    """`ForwardBatch.tokens_per_seq` of a step: the tokens every chunk runs (its own and its drafts) when
    that is the same number, at least 2, for all of them; else 0."""
    lengths = {chunk.num_tokens + len(chunk.draft) for chunk in chunks}
    return lengths.pop() if len(lengths) == 1 and 1 not in lengths else 0
