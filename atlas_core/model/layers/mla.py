"""Multi-head latent attention (MLA, DeepSeek-V2/V3, Mistral Small 4) over a compressed latent KV cache.

Per token the checkpoint's projections give queries ``[H, Dn + R]`` (through a low-rank
``q_a_proj -> q_a_layernorm -> q_b_proj``, or one ``q_proj``), and one shared compressed row
``kv_a_proj_with_mqa(x) = [latent (L) | k_rope (R)]``. The latent goes through ``kv_a_layernorm``;
``kv_b_proj`` would expand it into per-head keys (``Dn``) and values (``Dv``). Only the normed latent
and the rotated ``k_rope`` are cached (`LatentKVLayout`: ``L + R`` values per token instead of
``2 * H * (Dn + R)``).

The layer runs the absorbed form for every token: ``kv_b_proj``'s key half is folded into the
queries (``q_latent = W_UK^T q_nope``, so ``q_nope . k_nope = q_latent . latent``) and its value half
into the output (``out = W_UV (softmax . latent)``), so attention reads the latent cache directly.
This equals the expanded form exactly in real arithmetic (the parity and conformance tests compare
the two), for prefill chunks and decode tokens alike.

Rotary layout: transformers rotates DeepSeek's rope dims in interleaved pairs when the config says
``rope_interleave``; `deinterleave_rope_rows` permutes those weight rows once at load time so the
standard rotate-half ``Backend.rope`` gives the same scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.mla import MLAOps
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.weights.quantized import QuantizedWeight, take_rows

W = TypeVar("W", bound=np.ndarray | QuantizedWeight)


@dataclass(frozen=True)
class MLAShape:
    """Head counts and widths of one MLA layer (Hugging Face config names in brackets).

    heads [num_attention_heads] H; nope_dim [qk_nope_head_dim] Dn; rope_dim [qk_rope_head_dim] R;
    v_dim [v_head_dim] Dv; latent_dim [kv_lora_rank] L; q_lora_rank None when queries use one ``q_proj``.
    """

    heads: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    latent_dim: int
    q_lora_rank: int | None

    @property
    def q_width(self) -> int:
        """Query features per token, ``H * (Dn + R)``."""
        return self.heads * (self.nope_dim + self.rope_dim)

    @property
    def fused_q_width(self) -> int:
        """Width of the query part of the fused input projection: ``q_lora_rank`` or ``q_width``."""
        return self.q_width if self.q_lora_rank is None else self.q_lora_rank


@dataclass
class MLAWeights:
    """One MLA layer's weights, in the form the layer computes with (see `prepare_mla_weights`).

    fused_in ``[fused_q_width + L + R, hidden]``: ``q_a_proj`` (or ``q_proj``) rows, then
    ``kv_a_proj_with_mqa`` rows (rope rows de-interleaved where needed); fused_in_bias likewise or None.
    q_b ``[H * (Dn + R), q_lora_rank]`` with q_a_norm, or both None without a query low-rank.
    kv_a_norm: RMSNorm over the L latent values. uk ``[H, L, Dn]`` and uv ``[H, Dv, L]``: the key and
    value halves of ``kv_b_proj`` per head, for `Backend.mla_head_linear`. o ``[hidden, H * Dv]``, o_bias.
    """

    fused_in: Array
    kv_a_norm: RMSNorm
    uk: Array
    uv: Array
    o: Array
    q_b: Array | None = None
    q_a_norm: RMSNorm | None = None
    fused_in_bias: Array | None = None
    o_bias: Array | None = None


class MultiHeadLatentAttention:
    """Self-attention of one MLA layer over its `LatentKVLayout` cache (a `Mixer`)."""

    def __init__(
        self,
        backend: Backend,
        weights: MLAWeights,
        *,
        layer_index: int,
        shape: MLAShape,
        rope_cos: Array,
        rope_sin: Array,
        scale: float,
        position_scale: Array | None = None,
    ) -> None:
        """``scale``: the softmax scale (``(Dn + R) ** -0.5``, times any YaRN mscale correction).
        ``position_scale``: optional float32 ``[max_positions]`` table multiplying the scores of a
        query at each position (Mistral 4's Llama-4 style attention temperature); None for none."""
        if (weights.q_b is None) != (shape.q_lora_rank is None) or (weights.q_b is None) != (weights.q_a_norm is None):
            raise ValueError("MLA weights: q_b and q_a_norm are given exactly when q_lora_rank is set")
        self.backend, self.weights, self.shape = backend, weights, shape
        self.layer_index = layer_index
        self.rope_cos, self.rope_sin = rope_cos, rope_sin
        self.scale = scale
        self.position_scale = position_scale

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w, s = self.backend, self.weights, self.shape
        mla = backend.ops(MLAOps)
        tokens = x.shape[0]
        fused = backend.linear(x, w.fused_in, w.fused_in_bias)
        q_part, kv_part = fused[:, : s.fused_q_width], fused[:, s.fused_q_width :]
        if w.q_b is not None and w.q_a_norm is not None:  # both or neither (checked in __init__)
            q_part = backend.linear(w.q_a_norm(q_part)[0], w.q_b)
        q = q_part.reshape(tokens, s.heads, s.nope_dim + s.rope_dim)
        q_nope, q_rope = q[:, :, : s.nope_dim], q[:, :, s.nope_dim :]
        latent = w.kv_a_norm(kv_part[:, : s.latent_dim])[0]
        k_rope = kv_part[:, s.latent_dim :]
        backend.rope(q_rope, k_rope.reshape(tokens, 1, s.rope_dim), batch.positions, self.rope_cos, self.rope_sin)

        cache = kv.keys[self.layer_index]
        mla.mla_write_latent(cache, latent, k_rope, batch.attention.slot_mapping)
        q_latent = mla.mla_head_linear(q_nope, w.uk)
        row_scale = None if self.position_scale is None else self.position_scale[batch.positions]
        mixed = mla.mla_attention(q_latent, q_rope, cache, batch.attention, self.scale, row_scale)
        heads_out = mla.mla_head_linear(mixed, w.uv)
        return backend.linear(heads_out.reshape(tokens, s.heads * s.v_dim), w.o, w.o_bias)


def deinterleave_rope_rows(weight: W, *, group: int, start: int, rope_dim: int) -> W:
    """Reorder the rotary output rows of a projection from interleaved pairs to rotate-half order.

    ``weight`` has output rows (first axis) in groups of ``group`` (a head, or the whole
    ``kv_a_proj_with_mqa``); in each group the ``rope_dim`` rows from ``start`` become the even ones
    followed by the odd ones. Works on a weight ``[N, K]`` and a bias ``[N]`` alike, and on a host
    `QuantizedWeight` (rows moved with their scales: `atlas_core.weights.quantized.take_rows`).
    """
    order = np.arange(weight.shape[0]).reshape(-1, group)
    rope = order[:, start : start + rope_dim]
    order[:, start : start + rope_dim] = np.concatenate([rope[:, 0::2], rope[:, 1::2]], axis=1)
    return cast(W, take_rows(weight, order.reshape(-1)))


def split_kv_b(kv_b: np.ndarray, shape: MLAShape) -> tuple[np.ndarray, np.ndarray]:
    """``kv_b_proj.weight [H * (Dn + Dv), L]`` -> ``(uk [H, L, Dn], uv [H, Dv, L])`` for `mla_head_linear`."""
    expected = (shape.heads * (shape.nope_dim + shape.v_dim), shape.latent_dim)
    if kv_b.shape != expected:
        raise ValueError(f"kv_b_proj has shape {kv_b.shape}, expected {expected}")
    per_head = kv_b.reshape(shape.heads, shape.nope_dim + shape.v_dim, shape.latent_dim)
    uk = np.ascontiguousarray(per_head[:, : shape.nope_dim].transpose(0, 2, 1))
    uv = np.ascontiguousarray(per_head[:, shape.nope_dim :])
    return uk, uv
