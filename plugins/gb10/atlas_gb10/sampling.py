"""Logits ops on the device: argmax, log-softmax, penalties and biases, and the full sampler.

Greedy rows are an argmax kernel. Rows with a temperature are sorted on the device in the order of
the contract (descending probability, ties by lower id: one 64-bit key per entry, the flipped float
bits above the token id) and filtered with array operations that follow `Backend.sample` step by step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.backends.base import LogitAdjustments, SamplingTensors

ROW_THREADS = 1024


class LogitsOps:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.cp = backend.cp

    def _row_kernel(self, stem: str, logits: Any) -> tuple[Any, Any]:
        logits = self.backend.contiguous_rows(logits)
        if logits.dtype == self.backend.activation_dtype:
            suffix = "bf16"
        elif logits.dtype == np.float32:
            suffix = "f32"
        else:
            raise TypeError(f"cuda backend: {stem} takes bfloat16 or float32 logits, got {logits.dtype}")
        return self.backend.kernels.function("logits", f"{stem}_{suffix}"), logits

    def argmax(self, logits: Any) -> Any:
        rows, vocab = logits.shape
        out = self.cp.empty((rows,), dtype=np.int32)
        if rows:
            kernel, logits = self._row_kernel("argmax", logits)
            kernel(
                (rows,), (ROW_THREADS,), (logits, np.int64(logits.strides[0] // logits.itemsize), np.int32(vocab), out)
            )
        return out

    def log_softmax(self, logits: Any) -> Any:
        rows, vocab = logits.shape
        out = self.cp.empty((rows, vocab), dtype=np.float32)
        if rows:
            kernel, logits = self._row_kernel("log_softmax", logits)
            kernel(
                (rows,), (ROW_THREADS,), (logits, np.int64(logits.strides[0] // logits.itemsize), np.int32(vocab), out)
            )
        return out

    def adjust(self, logits: Any, adj: LogitAdjustments) -> None:
        if adj.is_empty:
            return
        backend, cp = self.backend, self.cp
        backend.require_bf16("adjust_logits", logits)
        if logits.strides[-1] != logits.itemsize:
            raise ValueError("cuda backend: adjust_logits needs logits with a contiguous vocabulary axis")
        ld = np.int64(logits.strides[0] // logits.itemsize)
        vocab = logits.shape[1]
        kernels = backend.kernels
        if len(adj.penalty_rows):
            entries = len(adj.penalty_rows)
            kernels.function("logits", "apply_penalties_bf16")(
                ((entries + 255) // 256,),
                (256,),
                (
                    logits,
                    ld,
                    np.int32(entries),
                    cp.asarray(adj.penalty_rows, dtype=np.int32),
                    cp.asarray(adj.penalty_tokens, dtype=np.int32),
                    cp.asarray(adj.output_counts, dtype=np.int32),
                    cp.asarray(adj.in_prompt, dtype=np.uint8),
                    cp.asarray(adj.repetition_penalty, dtype=np.float32),
                    cp.asarray(adj.presence_penalty, dtype=np.float32),
                    cp.asarray(adj.frequency_penalty, dtype=np.float32),
                ),
            )
        if len(adj.bias_rows):
            keys = adj.bias_rows.astype(np.int64) * vocab + adj.bias_tokens.astype(np.int64)
            unique, inverse = np.unique(keys, return_inverse=True)
            sums = np.zeros(len(unique), dtype=np.float64)
            np.add.at(sums, inverse, adj.bias_values.astype(np.float64))
            entries = len(unique)
            kernels.function("logits", "add_biases_bf16")(
                ((entries + 255) // 256,),
                (256,),
                (
                    logits,
                    ld,
                    np.int32(entries),
                    cp.asarray(unique // vocab, dtype=np.int32),
                    cp.asarray(unique % vocab, dtype=np.int32),
                    cp.asarray(sums, dtype=np.float32),
                ),
            )

    def sample(self, logits: Any, params: SamplingTensors) -> Any:
        tokens = self.argmax(logits)
        hot = np.flatnonzero(params.temperature > 0)
        if len(hot) == 0:
            return tokens
        cp = self.cp
        rows = cp.asarray(hot.astype(np.int32))

        def per_row(values: np.ndarray, dtype: type) -> Any:
            return cp.asarray(np.asarray(values)[hot], dtype=dtype)

        z = logits.astype(np.float32)[rows] / per_row(params.temperature, np.float32)[:, None]
        count, vocab = z.shape
        order = descending_order(cp, z)
        zs = cp.take_along_axis(z, order, axis=1)
        probs = cp.exp(zs - zs[:, :1])
        probs /= probs.sum(axis=1, keepdims=True)
        columns = cp.arange(vocab, dtype=np.int32)[None, :]
        keep = cp.full((count,), vocab, dtype=np.int32)

        n_sigma = per_row(
            params.top_n_sigma if params.top_n_sigma is not None else np.zeros(len(params.temperature), np.float32),
            np.float32,
        )
        finite = cp.isfinite(zs)
        n_finite = finite.sum(axis=1)
        mean = cp.where(finite, zs, 0).sum(axis=1) / n_finite
        std = cp.sqrt(cp.where(finite, (zs - mean[:, None]) ** 2, 0).sum(axis=1) / n_finite)
        within = (zs >= (zs[:, 0] - n_sigma * std)[:, None]).sum(axis=1).astype(np.int32)
        keep = cp.where(n_sigma > 0, cp.minimum(keep, within), keep)

        top_k = per_row(params.top_k, np.int32)
        keep = cp.where(top_k > 0, cp.minimum(keep, top_k), keep)

        top_p = per_row(params.top_p, np.float32)
        mass = cp.cumsum(cp.where(columns < keep[:, None], probs, 0), axis=1)
        kept_mass = cp.take_along_axis(mass, (keep - 1)[:, None], axis=1)
        below = ((mass / kept_mass < top_p[:, None]) & (columns < keep[:, None])).sum(axis=1).astype(np.int32) + 1
        keep = cp.where(top_p < 1, cp.minimum(keep, below), keep)

        min_p = per_row(params.min_p, np.float32)
        above = (probs >= (min_p * probs[:, 0])[:, None]).sum(axis=1).astype(np.int32)
        keep = cp.where(min_p > 0, cp.minimum(keep, above), keep)

        kept = cp.cumsum(cp.where(columns < keep[:, None], probs, 0), axis=1)
        total = cp.take_along_axis(kept, (keep - 1)[:, None], axis=1)[:, 0]
        target = per_row(params.uniform, np.float32) * total
        index = ((kept <= target[:, None]) & (columns < keep[:, None])).sum(axis=1).astype(np.int32)
        index = cp.minimum(index, keep - 1)
        tokens[rows] = cp.take_along_axis(order, index[:, None], axis=1)[:, 0]
        return tokens


def descending_order(cp: Any, z: Any) -> Any:
    """Per row, token ids by descending ``z``, ties by lower id (a stable order whatever the sort)."""
    bits = z.view(np.uint32)
    ascending = cp.where((bits >> 31) != 0, ~bits, bits | np.uint32(0x80000000))  # orders like the floats
    keys = ((~ascending).astype(np.uint64) << np.uint64(32)) | cp.arange(z.shape[1], dtype=np.uint64)[None, :]
    keys = cp.sort(keys, axis=1)
    return (keys & np.uint64(0xFFFFFFFF)).astype(np.int32)
