"""The reference backend: NumPy, float32 math. The executable specification of every op."""

from __future__ import annotations

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata, Backend, LogitAdjustments, SamplingTensors
from atlas_core.backends.kv_dtypes import dequantize_kv, quantize_kv
from atlas_core.weights.gguf_quantized import FORMATS as GGUF_FORMATS
from atlas_core.weights.nvfp4 import NVFP4
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight, dequantize, regrid

DEQUANTIZE_ELEMENTS = 1 << 24
"""`NumpyBackend.linear` dequantizes a quantized weight this many elements (64 MiB of float32) at a time."""


class NumpyBackend(Backend):
    """Runs everywhere. Weights are stored as float32 (bf16/fp16 checkpoints are upcast once at
    load), except quantized weights, which stay as they are (1 byte per FP8 element plus its block's
    scale; GGUF blocks as their bytes) and are dequantized on use; matrix products go to the BLAS NumPy
    links against."""

    name = "numpy"
    activation_dtype = np.dtype(np.float32)
    quantized_formats = frozenset({FP8_E4M3, NVFP4, *GGUF_FORMATS.values()})
    kv_cache_dtypes = frozenset({"bf16", "fp8"})

    def from_numpy(self, array: np.ndarray, *, weight: bool = False, dtype: np.dtype | None = None) -> Array:
        array = np.asarray(array)
        if dtype is not None:
            return np.ascontiguousarray(array, dtype=dtype)
        if array.dtype.kind in "iub":
            return np.ascontiguousarray(array, dtype=np.int32)
        return np.ascontiguousarray(array, dtype=np.float32)

    def upload_quantized(self, weight: QuantizedWeight) -> Array | QuantizedWeight:
        """Kept quantized (``fp8_e4m3``, ``gguf_*``), its arrays copied into memory: a view of the checkpoint would keep
        the whole file mapped, counting again in the process's resident memory beside fused copies."""
        if weight.format not in self.quantized_formats:
            return super().upload_quantized(weight)
        return weight.map_arrays(lambda array: np.array(array, order="C", copy=True))

    def to_numpy(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type) -> Array:
        out = np.empty(shape, dtype=dtype)
        out.fill(0)  # resident now: np.zeros' pages would be committed one by one as KV blocks get used
        return out

    def embedding(self, weight: Array, ids: Array) -> Array:
        return weight[ids].astype(np.float32, copy=False)

    def linear(
        self, x: Array, weight: Array | QuantizedWeight, bias: Array | None = None, out: Array | None = None
    ) -> Array:
        if isinstance(weight, QuantizedWeight):
            return _dequantized_linear(x, weight, bias, out)
        result = np.matmul(x, weight.T, out=out)
        if bias is not None:
            result += bias
        return result

    def rms_norm(self, x: Array, weight: Array, eps: float, residual: Array | None = None) -> tuple[Array, Array]:
        summed = x if residual is None else x + residual
        mean_square = np.einsum("...i,...i->...", summed, summed) / summed.shape[-1]
        inv_rms = 1.0 / np.sqrt(mean_square + eps, dtype=np.float32)
        return (summed * inv_rms[..., None]) * weight, summed

    def silu_mul(self, x: Array, out: Array | None = None) -> Array:
        half = x.shape[-1] // 2
        gate, up = x[..., :half], x[..., half:]
        result = np.multiply(gate, up, out=out)
        with np.errstate(over="ignore"):  # exp overflows to inf for gates below -88: silu -> 0, as it should
            result /= 1.0 + np.exp(-gate)
        return result

    def gelu_tanh_mul(self, x: Array, out: Array | None = None) -> Array:
        half = x.shape[-1] // 2
        gate, up = x[..., :half], x[..., half:]
        inner = np.float32(np.sqrt(2.0 / np.pi)) * (gate + np.float32(0.044715) * gate * gate * gate)
        result = np.multiply(gate, up, out=out)
        result *= 0.5 * (1.0 + np.tanh(inner))
        return result

    def rope(self, q: Array, k: Array, positions: Array, cos: Array, sin: Array) -> None:
        half = cos.shape[1]
        cos_t = cos[positions][:, None, :]
        sin_t = sin[positions][:, None, :]
        for x in (q, k):
            first = x[..., :half].copy()
            second = x[..., half : 2 * half]
            x[..., :half] = first * cos_t - second * sin_t
            x[..., half : 2 * half] = second * cos_t + first * sin_t

    def write_kv(self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array) -> None:
        self.write_kv_scaled(k_cache, v_cache, k, v, slot_mapping, 1.0, 1.0)

    def write_kv_scaled(
        self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array, k_scale: float, v_scale: float
    ) -> None:
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        flat_shape = (-1,) + k_cache.shape[2:]
        for cache, x, x_scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
            rows = x[keep]
            cache.reshape(flat_shape)[slots] = (
                rows if cache.dtype == rows.dtype else quantize_kv(rows, cache.dtype, x_scale)
            )

    def attention(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        out: Array | None = None,
        sliding_window: int | None = None,
    ) -> Array:
        return self._attention(q, k_cache, v_cache, meta, scale, 1.0, 1.0, out, sliding_window)

    def attention_scaled(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        k_scale: float,
        v_scale: float,
        sliding_window: int | None = None,
    ) -> Array:
        return self._attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, None, sliding_window)

    def _attention(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        k_scale: float,
        v_scale: float,
        out: Array | None,
        sliding_window: int | None,
    ) -> Array:
        """`attention` over caches of any KV dtype: rows not in ``q``'s dtype are widened to float32
        (fp8 rows times ``k_scale`` / ``v_scale``, `atlas_core.backends.kv_dtypes.dequantize_kv`)."""
        out = np.empty_like(q) if out is None else out
        block_size, num_kv_heads, head_dim = k_cache.shape[1:]
        group = q.shape[1] // num_kv_heads
        for b in range(meta.num_seqs):
            start, end = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1])
            q_len, ctx = end - start, int(meta.seq_lens[b])
            if q_len == 0:
                continue
            # keys before `first` are outside every query's window: skip their blocks entirely
            first = 0 if sliding_window is None else max(0, ctx - q_len - sliding_window + 1) // block_size * block_size
            blocks = meta.block_tables[b, first // block_size : -(-ctx // block_size)]
            keys = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: ctx - first]
            values = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: ctx - first]
            if keys.dtype != q.dtype:
                keys, values = dequantize_kv(keys, k_scale), dequantize_kv(values, v_scale)
            # [q_len, Hq, D] -> [Hk, group * q_len, D]
            grouped = q[start:end].reshape(q_len, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3)
            grouped = grouped.reshape(num_kv_heads, group * q_len, head_dim)
            scores = np.matmul(grouped, keys.transpose(1, 2, 0)) * scale
            scores = scores.reshape(num_kv_heads, group, q_len, ctx - first)
            query_pos = np.arange(ctx - q_len, ctx)[:, None]
            key_pos = np.arange(first, ctx)[None, :]
            last = query_pos if meta.visible_end is None else meta.visible_end[start:end, None] - 1
            visible = key_pos <= last
            if sliding_window is not None:
                visible &= key_pos > query_pos - sliding_window
            if not visible.all():
                scores = np.where(visible, scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            mixed = np.matmul(probs.reshape(num_kv_heads, group * q_len, ctx - first), values.transpose(1, 0, 2))
            out[start:end] = (
                mixed.reshape(num_kv_heads, group, q_len, head_dim)
                .transpose(2, 0, 1, 3)
                .reshape(q_len, num_kv_heads * group, head_dim)
            )
        return out

    def log_softmax(self, logits: Array) -> Array:
        logits = logits.astype(np.float32, copy=False)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

    def argmax(self, logits: Array) -> Array:
        return np.argmax(logits, axis=-1).astype(np.int32)

    def adjust_logits(self, logits: Array, adj: LogitAdjustments) -> None:
        if len(adj.penalty_rows):
            rows, tokens = adj.penalty_rows, adj.penalty_tokens
            counts = adj.output_counts.astype(np.float32)
            values = logits[rows, tokens].astype(np.float32, copy=False)  # a gathered copy
            penalty = adj.repetition_penalty[rows]
            repeated = adj.in_prompt | (counts > 0)
            values = np.where(repeated, np.where(values > 0, values / penalty, values * penalty), values)
            values -= adj.frequency_penalty[rows] * counts + adj.presence_penalty[rows] * (counts > 0)
            logits[rows, tokens] = values
        if len(adj.bias_rows):
            np.add.at(logits, (adj.bias_rows, adj.bias_tokens), adj.bias_values.astype(logits.dtype))

    def sample(self, logits: Array, params: SamplingTensors) -> Array:
        tokens = self.argmax(logits)
        n_sigma = params.top_n_sigma if params.top_n_sigma is not None else np.zeros(len(tokens), np.float32)
        for row in np.flatnonzero(params.temperature > 0):
            tokens[row] = _sample_row(
                logits[row].astype(np.float64),
                float(params.temperature[row]),
                int(params.top_k[row]),
                float(params.top_p[row]),
                float(params.min_p[row]),
                float(params.uniform[row]),
                float(n_sigma[row]),
            )
        return tokens


def _dequantized_linear(
    x: np.ndarray, weight: QuantizedWeight, bias: np.ndarray | None, out: np.ndarray | None
) -> np.ndarray:
    """`NumpyBackend.linear` of a quantized ``weight [N, K]``: the product with its dequantized values
    (`atlas_core.weights.quantized.dequantize`), dequantized in whole blocks of rows of at most
    `DEQUANTIZE_ELEMENTS` elements so that no float32 copy of a large weight is ever held."""
    rows, cols = weight.shape
    if out is None:
        out = np.empty((x.shape[0], rows), dtype=np.float32)
    if weight.block[0] > 1 and cols * weight.block[0] > DEQUANTIZE_ELEMENTS:
        weight = regrid(weight, (1, weight.block[1]))  # e.g. one scale per tensor: chunk by rows instead
    bn = weight.block[0]
    step = max(1, DEQUANTIZE_ELEMENTS // max(cols * bn, 1)) * bn
    if step >= rows:
        np.matmul(x, dequantize(weight).T, out=out)
    else:
        for start in range(0, rows, step):
            block_rows = slice(start // bn, -(-min(start + step, rows) // bn))
            part = QuantizedWeight(
                weight.format,
                weight.data[start : start + step],
                None if weight.scales is None else weight.scales[block_rows],
                weight.block,
                (min(step, rows - start), cols),
            )
            out[:, start : start + step] = x @ dequantize(part).T
    if bias is not None:
        out += bias
    return out


def _sample_row(
    logits: np.ndarray,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    uniform: float,
    top_n_sigma: float = 0.0,
) -> int:
    """One row of `Backend.sample` (float64 for a stable reference). Every filter keeps a prefix of
    the descending-probability order: top-n-sigma, then top_k, then top_p (renormalised over what
    is left), then min_p (relative to the most likely token); then an inverse-CDF draw."""
    order = np.argsort(-logits, kind="stable")
    scaled = logits[order] / temperature
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    keep = len(probs)
    if top_n_sigma > 0.0:
        finite = scaled[np.isfinite(scaled)]
        keep = int(np.count_nonzero(scaled >= scaled[0] - top_n_sigma * finite.std()))
    if top_k > 0:
        keep = min(keep, top_k)
    if top_p < 1.0:
        mass = np.cumsum(probs[:keep])
        keep = min(keep, int(np.searchsorted(mass / mass[-1], top_p)) + 1)
    if min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= min_p * probs[0])))
    kept = np.cumsum(probs[:keep])
    index = int(np.searchsorted(kept, uniform * kept[-1], side="right"))
    return int(order[min(index, keep - 1)])
