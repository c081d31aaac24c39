"""Ops of the mla group (multi-head latent attention) with a host fallback (see `atlas_core.backends.ops`).

Shape letters: T tokens, H query heads, L latent width (``kv_lora_rank``), R rotary width
(``qk_rope_head_dim``), W = L + R. The latent cache of a layer is ``[num_blocks, block_size, 1, W]``
(`atlas_core.batch.kv_cache.LatentKVLayout`): per token the normed latent, then the rotated shared
key part.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from atlas_core.backends.ops import OpGroup, host_state, on_host

if TYPE_CHECKING:
    from atlas_core.backends.base import Array, AttentionMetadata


# ---- NumPy references (host arrays in and out) -----------------------------------------------------
def head_linear_reference(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``out[t, h, n] = sum_k x[t, h, k] * weight[h, n, k]``: ``x [T, H, K]``, ``weight [H, N, K]`` -> ``[T, H, N]``."""
    x, weight = x.astype(np.float32, copy=False), weight.astype(np.float32, copy=False)
    return np.ascontiguousarray(np.matmul(x.transpose(1, 0, 2), weight.transpose(0, 2, 1)).transpose(1, 0, 2))


def write_latent_reference(cache: np.ndarray, latent: np.ndarray, k_rope: np.ndarray, slot_mapping: np.ndarray) -> None:
    """``cache[s // block_size, s % block_size, 0] = concat(latent[t], k_rope[t])`` for ``s = slot_mapping[t] >= 0``."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat = cache.reshape(-1, cache.shape[-1])
    width = latent.shape[-1]
    flat[slots, :width] = latent[keep]
    flat[slots, width:] = k_rope[keep]


def latent_attention_reference(
    q_latent: np.ndarray,
    q_rope: np.ndarray,
    cache: np.ndarray,
    meta: AttentionMetadata,
    scale: float,
    row_scale: np.ndarray | None = None,
) -> np.ndarray:
    """Causal paged attention over the latent cache; see `MLAOps.mla_attention` for the contract."""
    q_latent, q_rope = q_latent.astype(np.float32, copy=False), q_rope.astype(np.float32, copy=False)
    tokens, heads, width = q_latent.shape
    block_size = cache.shape[1]
    out = np.empty((tokens, heads, width), dtype=np.float32)
    for b in range(meta.num_seqs):
        start, end = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1])
        q_len, ctx = end - start, int(meta.seq_lens[b])
        if q_len == 0:
            continue
        rows = (
            cache[meta.block_tables[b, : -(-ctx // block_size)]].reshape(-1, cache.shape[-1])[:ctx].astype(np.float32)
        )
        latent, rope = rows[:, :width], rows[:, width:]
        # [H, q_len, ctx]
        scores = np.matmul(q_latent[start:end].transpose(1, 0, 2), latent.T)
        scores += np.matmul(q_rope[start:end].transpose(1, 0, 2), rope.T)
        row_factor = scale if row_scale is None else scale * row_scale[start:end, None]
        scores *= row_factor
        visible = np.arange(ctx)[None, :] <= np.arange(ctx - q_len, ctx)[:, None]
        scores = np.where(visible, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out[start:end] = np.matmul(probs, latent).transpose(1, 0, 2)
    return out


# ---- the op group --------------------------------------------------------------------------------
class MLAOps(OpGroup):
    """The mla op group: every op defaults to its NumPy reference run on the host; a backend's
    native implementation (registered through ``register_op_implementations``) overrides them."""

    name = "mla"

    def mla_head_linear(self, x: Array, weight: Array, out: Array | None = None) -> Array:
        """Per-head matrix product: ``x [T, H, K]`` (activations, may be a strided view) times
        ``weight [H, N, K]`` (uploaded with ``weight=True``) -> ``[T, H, N]`` activations,
        ``out[t, h, n] = sum_k x[t, h, k] * weight[h, n, k]``, accumulated in at least fp32.

        MLA uses it to fold ``kv_b_proj`` into the queries (``K = qk_nope_head_dim``, ``N = L``) and
        into the output (``K = L``, ``N = v_head_dim``). ``out`` optional; inputs unchanged.
        """
        return _with_out(on_host(self.backend, head_linear_reference, x, weight), out)

    def mla_write_latent(self, cache: Array, latent: Array, k_rope: Array, slot_mapping: Array) -> None:
        """Store each token's latent and rotated key part into the latent cache, in place.

        ``cache [num_blocks, block_size, 1, L + R]`` (activation dtype), ``latent [T, L]``,
        ``k_rope [T, R]`` (either may be a strided view), ``slot_mapping [T]`` int32: token t goes to
        flat slot ``s = slot_mapping[t]``, i.e. ``cache[s // block_size, s % block_size, 0] =
        concat(latent[t], k_rope[t])``; -1 skips the token. Nothing else changes; copies are exact.
        Returns None.
        """
        with host_state(self.backend, cache) as (cache_on_host,):
            on_host(self.backend, write_latent_reference, cache_on_host, latent, k_rope, slot_mapping)

    def mla_attention(
        self,
        q_latent: Array,
        q_rope: Array,
        cache: Array,
        meta: AttentionMetadata,
        scale: float,
        row_scale: Array | None = None,
        out: Array | None = None,
    ) -> Array:
        """Causal paged attention over the latent cache (the absorbed form of MLA): one key/value
        head shared by every query head, whose key is the whole cache row and whose value is its
        first L entries.

        ``q_latent [T, H, L]`` (the non-rotary query part already multiplied into latent space),
        ``q_rope [T, H, R]`` (rotated; may be a strided view), ``cache`` as in `mla_write_latent`
        (this step's tokens already written), ``meta`` the core `AttentionMetadata` (same sequence,
        position and block rules as ``Backend.attention``), ``row_scale [T]`` float32 or None (a
        per-query-row factor on the scores, e.g. Llama-4 style position temperature).
        For query row t of sequence b at position p and key position j <= p with cache row
        ``c_j = [latent_j | rope_j]``: ``score = scale * row_scale[t] * (q_latent[t, h] . latent_j +
        q_rope[t, h] . rope_j)``; ``out[t, h] = sum_j softmax_j(score) * latent_j`` -> ``[T, H, L]``.
        Reads only the slots named by the block tables; ``out`` optional; inputs unchanged.
        """
        host_meta = _host_metadata(self.backend, meta)
        result = on_host(
            self.backend,
            functools.partial(latent_attention_reference, meta=host_meta),
            q_latent,
            q_rope,
            cache,
            scale=float(scale),
            row_scale=row_scale,
        )
        return _with_out(result, out)


def _host_metadata(backend: Any, meta: AttentionMetadata) -> AttentionMetadata:
    """The metadata with every field copied to the host as a NumPy array."""
    return dataclasses.replace(
        meta, **{f.name: np.asarray(backend.to_numpy(getattr(meta, f.name))) for f in dataclasses.fields(meta)}
    )


def _with_out(result: Array, out: Array | None) -> Array:
    """``result``, or ``out`` filled with it (the ``out=`` convention of every op)."""
    if out is None:
        return result
    out[...] = result
    return out
