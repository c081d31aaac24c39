"""`ModelRunner`: scheduled chunks -> one `ForwardBatch` -> model forward -> logits -> tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import AttentionMetadata, Backend, SamplingTensors
from atlas_core.engine.forward_batch import ForwardBatch
from atlas_core.engine.kv_cache import KVCache, slots_for
from atlas_core.engine.logprobs import position_logprobs
from atlas_core.engine.sequence import Sequence
from atlas_core.model.transformer import TransformerModel
from atlas_core.tokenizer import Tokenizer


@dataclass
class ScheduledChunk:
    """``num_tokens`` of ``seq``'s not-yet-computed tokens to run this step (a prefill chunk or one decode token)."""

    seq: Sequence
    num_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence's known tokens, so a token is sampled."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.token_ids)


@dataclass
class _Rows:
    """Which logits rows belong to which sequence: prompt-logprob rows and the sampling row."""

    prompt_rows: list[tuple[Sequence, int, int, int]]  # (seq, first logits row, position it predicts, row count)
    sample_rows: list[tuple[Sequence, int]]


class ModelRunner:
    """Runs the model over scheduled chunks and appends sampled tokens to their sequences."""

    def __init__(self, model: TransformerModel, backend: Backend, kv: KVCache, tokenizer: Tokenizer | None) -> None:
        self.model, self.backend, self.kv, self.tokenizer = model, backend, kv, tokenizer

    def build_batch(self, chunks: list[ScheduledChunk]) -> tuple[ForwardBatch, _Rows]:
        ids, positions, slots, logits_rows = [], [], [], []
        starts, seq_lens = [0], []
        rows = _Rows([], [])
        max_blocks = max(len(c.seq.blocks) for c in chunks)
        tables = np.full((len(chunks), max_blocks), -1, dtype=np.int32)
        for b, chunk in enumerate(chunks):
            seq, start = chunk.seq, chunk.seq.num_computed
            end = start + chunk.num_tokens
            ids.extend(seq.token_ids[start:end])
            positions.append(np.arange(start, end, dtype=np.int32))
            slots.append(slots_for(seq.blocks, self.kv.block_size, start, end))
            tables[b, : len(seq.blocks)] = seq.blocks
            first_row = starts[-1]
            if seq.prompt_logprobs is not None and start < len(seq.prompt_ids):
                last_predicted = min(end, len(seq.prompt_ids) - 1)  # rows predicting prompt positions start+1..
                count = max(0, last_predicted - start)
                rows.prompt_rows.append((seq, len(logits_rows), start + 1, count))
                logits_rows.extend(range(first_row, first_row + count))
            if chunk.samples:
                rows.sample_rows.append((seq, len(logits_rows)))
                logits_rows.append(first_row + chunk.num_tokens - 1)
            starts.append(first_row + chunk.num_tokens)
            seq_lens.append(end)
        upload = self.backend.from_numpy
        meta = AttentionMetadata(
            query_start_loc=upload(np.asarray(starts, dtype=np.int32)),
            seq_lens=upload(np.asarray(seq_lens, dtype=np.int32)),
            block_tables=upload(tables),
            slot_mapping=upload(np.concatenate(slots).astype(np.int32)),
        )
        batch = ForwardBatch(
            input_ids=self.backend.from_numpy(np.asarray(ids, dtype=np.int32)),
            positions=self.backend.from_numpy(np.concatenate(positions)),
            attention=meta,
            logits_rows=np.asarray(logits_rows, dtype=np.int64),
        )
        return batch, rows

    def execute(self, chunks: list[ScheduledChunk]) -> dict[str, str]:
        """Run one step; returns ``{request_id: new visible text}`` for sequences that got a token."""
        batch, rows = self.build_batch(chunks)
        hidden = self.model.forward(batch, self.kv)
        for chunk in chunks:
            chunk.seq.num_computed += chunk.num_tokens
        if len(batch.logits_rows) == 0:
            return {}
        logits = self.model.compute_logits(hidden[self.backend.from_numpy(batch.logits_rows)])
        need_logprobs = rows.prompt_rows or any(seq.logprobs is not None for seq, _ in rows.sample_rows)
        logprobs = self.backend.to_numpy(self.backend.log_softmax(logits)) if need_logprobs else None
        if rows.prompt_rows:
            self._record_prompt_logprobs(rows, logprobs)
        return self._sample(rows, logits, logprobs)

    def _record_prompt_logprobs(self, rows: _Rows, logprobs: np.ndarray) -> None:
        for seq, first, position, count in rows.prompt_rows:
            for i in range(count):
                token = seq.prompt_ids[position + i]
                seq.prompt_logprobs.append(
                    position_logprobs(logprobs[first + i], token, seq.params.prompt_logprobs, self.tokenizer)
                )

    def _sample(self, rows: _Rows, logits: object, logprobs: np.ndarray | None) -> dict[str, str]:
        if not rows.sample_rows:
            return {}
        seqs = [seq for seq, _ in rows.sample_rows]
        indices = np.asarray([row for _, row in rows.sample_rows])
        params = SamplingTensors(
            temperature=np.asarray([s.params.temperature for s in seqs], dtype=np.float32),
            top_k=np.asarray([s.params.top_k for s in seqs], dtype=np.int32),
            top_p=np.asarray([s.params.top_p for s in seqs], dtype=np.float32),
            min_p=np.asarray([s.params.min_p for s in seqs], dtype=np.float32),
            uniform=np.asarray([s.generator.random() for s in seqs], dtype=np.float32),
        )
        sample_logits = logits[self.backend.from_numpy(indices)] if len(indices) != logits.shape[0] else logits
        tokens = self.backend.to_numpy(self.backend.sample(sample_logits, params)).tolist()
        deltas = {}
        for seq, row, token in zip(seqs, indices.tolist(), tokens, strict=True):
            if logprobs is not None:
                entry = position_logprobs(logprobs[row], token, seq.params.logprobs or 0, self.tokenizer)
                seq.cumulative_logprob += entry[token].logprob
                if seq.logprobs is not None:
                    seq.logprobs.append(entry)
            deltas[seq.request_id] = seq.append_token(token)
        return deltas
