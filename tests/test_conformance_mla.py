"""Backend conformance: the multi-head latent attention ops (mla_head_linear, mla_write_latent,
mla_attention) and the `MultiHeadLatentAttention` layer built on them, against float64 oracles.

The layer runs the absorbed form (attention over the latent cache); its oracle is the expanded
("naive") form transformers computes: keys and values expanded per head from the latent with
``kv_b_proj``, the rotary part rotated in interleaved pairs on the checkpoint's own weight layout.

Fixtures, tolerances and the seed handling (``ATLAS_CONFORMANCE_SEED``) are in
``atlas_core.testing.conformance``; the paged batches come from the attention suite.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from atlas_core.backends.base import AttentionMetadata
from atlas_core.backends.ops.mla import MLAOps
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache, KVPlan, LatentKVLayout
from atlas_core.model.layers.mla import (
    MLAShape,
    MLAWeights,
    MultiHeadLatentAttention,
    deinterleave_rope_rows,
    split_kv_b,
)
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.oracles import rope_tables
from tests.test_conformance_attention import PagedBatch, oracle_write_kv, paged_batch, skip_pattern

LATENT, ROPE = 24, 8
PIPELINE_TOLERANCE_FACTOR = 4
"""The layer test chains seven ops (GEMMs, a norm, RoPE, attention); its bound is this multiple of
the per-op tolerance."""


# ---- float64 oracles -----------------------------------------------------------------------------
def oracle_head_linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    tokens, heads, _ = x.shape
    out = np.zeros((tokens, heads, weight.shape[1]))
    for t in range(tokens):
        for h in range(heads):
            out[t, h] = weight[h] @ x[t, h]
    return out


def oracle_latent_attention(
    q_latent: np.ndarray,
    q_rope: np.ndarray,
    cache: np.ndarray,
    meta: AttentionMetadata,
    scale: float,
    row_scale: np.ndarray | None,
) -> np.ndarray:
    block_size, width = cache.shape[1], q_latent.shape[2]
    out = np.full(q_latent.shape, np.nan)
    for b in range(meta.num_seqs):
        start, end, ctx = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1]), int(meta.seq_lens[b])
        table = meta.block_tables[b]
        for i, row in enumerate(range(start, end)):
            position = ctx - (end - start) + i
            rows = np.stack([cache[table[p // block_size], p % block_size, 0] for p in range(position + 1)])
            factor = scale * (1.0 if row_scale is None else row_scale[row])
            for h in range(q_latent.shape[1]):
                scores = (rows[:, :width] @ q_latent[row, h] + rows[:, width:] @ q_rope[row, h]) * factor
                weights = np.exp(scores - scores.max())
                out[row, h] = weights @ rows[:, :width] / weights.sum()
    return out


def latent_batch(case: Case, scenario: str) -> PagedBatch:
    """A paged batch whose one "key" cache is the latent cache ``[blocks, block_size, 1, L + R]``."""
    return paged_batch(case, scenario, 1, LATENT + ROPE)


# ---- ops -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tokens", "heads", "k", "n"), [(1, 4, 16, 24), (7, 3, 24, 12), (5, 2, 1, 9)])
def test_head_linear(case: Case, tokens: int, heads: int, k: int, n: int) -> None:
    wide_dev, wide = case.upload(case.normal(tokens, heads, k + 5))
    x_dev, x = wide_dev[:, :, 2 : 2 + k], wide[:, :, 2 : 2 + k]  # a strided view, as the layer passes q_nope
    weight_dev, weight = case.upload(case.normal(heads, n, k, scale=0.3), weight=True)
    want = oracle_head_linear(x, weight)
    with case.unchanged("mla_head_linear", x=x_dev, weight=weight_dev):
        case.check_out_variants(
            lambda out: case.backend.ops(MLAOps).mla_head_linear(x_dev, weight_dev, out=out),
            want,
            f"mla_head_linear {x.shape}x{weight.shape}",
        )


@pytest.mark.parametrize(("tokens", "pattern"), [(1, "write"), (1, "skip"), (11, "mixed")])
def test_write_latent(case: Case, tokens: int, pattern: str) -> None:
    num_blocks, block_size = 6, 5
    slots = case.rng.permutation(num_blocks * block_size)[:tokens]
    slots[skip_pattern(case, tokens, pattern)] = -1
    cache_dev, cache = case.upload(case.normal(num_blocks, block_size, 1, LATENT + ROPE))
    projection_dev, projection = case.upload(case.normal(tokens, 3 + LATENT + ROPE))
    latent_dev, k_rope_dev = projection_dev[:, 3 : 3 + LATENT], projection_dev[:, 3 + LATENT :]  # strided views
    slots_dev, slots = case.upload(slots.astype(np.int32))
    with case.unchanged("mla_write_latent", projection=projection_dev, slot_mapping=slots_dev):
        result = case.backend.ops(MLAOps).mla_write_latent(cache_dev, latent_dev, k_rope_dev, slots_dev)
    assert result is None, f"mla_write_latent works in place and returns None {case.tag}"
    want = oracle_write_kv(cache, projection[:, None, 3:], slots)
    case.assert_equal(case.host(cache_dev), want, f"mla_write_latent (slots {slots.tolist()}; -1 skips)")


@pytest.mark.parametrize("row_scaled", [False, True], ids=["plain", "row-scale"])
@pytest.mark.parametrize("scenario", ["mixed", "decode_t1", "decode_batch", "prefill"])
def test_latent_attention(case: Case, scenario: str, row_scaled: bool) -> None:
    batch, heads = latent_batch(case, scenario), 3
    tokens = len(batch.positions)
    q_latent_dev, q_latent = case.upload(case.normal(tokens, heads, LATENT, scale=0.4))
    q_wide_dev, q_wide = case.upload(case.normal(tokens, heads, 4 + ROPE, scale=0.4))
    q_rope_dev, q_rope = q_wide_dev[:, :, 4:], q_wide[:, :, 4:]  # a strided view, as the layer passes it
    row_scale_dev, row_scale = (None, None)
    if row_scaled:
        row_scale_dev, row_scale = case.upload(case.rng.uniform(1.0, 1.4, tokens).astype(np.float32))
    want = oracle_latent_attention(q_latent, q_rope, batch.k_cache, batch.host_meta, batch.scale, row_scale)
    with case.unchanged("mla_attention", q_latent=q_latent_dev, q_rope=q_wide_dev, cache=batch.k_cache_dev):
        case.check_out_variants(
            lambda out: case.backend.ops(MLAOps).mla_attention(
                q_latent_dev, q_rope_dev, batch.k_cache_dev, batch.meta, batch.scale, row_scale_dev, out=out
            ),
            want,
            f"mla_attention ({scenario}, {batch.describe()})",
        )


# ---- the layer: absorbed (ops) against expanded (oracle) -----------------------------------------
@dataclasses.dataclass
class Checkpoint:
    """One MLA layer's tensors in Hugging Face layout (rope rows interleaved), float64."""

    shape: MLAShape
    q_a: np.ndarray | None
    q_a_norm: np.ndarray | None
    q: np.ndarray  # q_b_proj [H (Dn + R), q_lora] or q_proj [H (Dn + R), hidden]
    kv_a: np.ndarray
    kv_a_bias: np.ndarray
    kv_a_norm: np.ndarray
    kv_b: np.ndarray
    o: np.ndarray
    eps: float = 1e-6


def random_checkpoint(case: Case, hidden: int, q_lora_rank: int | None) -> Checkpoint:
    shape = MLAShape(heads=3, nope_dim=8, rope_dim=ROPE, v_dim=6, latent_dim=LATENT, q_lora_rank=q_lora_rank)
    q_in = hidden if q_lora_rank is None else q_lora_rank

    def weight(rows: int, cols: int) -> np.ndarray:
        return case.normal(rows, cols, scale=cols**-0.5)

    return Checkpoint(
        shape=shape,
        q_a=None if q_lora_rank is None else weight(q_lora_rank, hidden),
        q_a_norm=None if q_lora_rank is None else 1.0 + case.normal(q_lora_rank, scale=0.1),
        q=weight(shape.q_width, q_in),
        kv_a=weight(LATENT + ROPE, hidden),
        kv_a_bias=case.normal(LATENT + ROPE, scale=0.1),
        kv_a_norm=1.0 + case.normal(LATENT, scale=0.1),
        kv_b=weight(shape.heads * (shape.nope_dim + shape.v_dim), LATENT),
        o=weight(hidden, shape.heads * shape.v_dim),
    )


def oracle_rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def oracle_interleaved_rope(x: np.ndarray, position: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """transformers' ``apply_rotary_pos_emb_interleave``: pairs (x0, x1), (x2, x3), ... rotated by one
    frequency each; the result is laid out [rotated evens | rotated odds]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[position], sin[position]
    return np.concatenate([even * c - odd * s, odd * c + even * s], axis=-1)


def oracle_mla(
    ck: Checkpoint,
    x: np.ndarray,
    batch: PagedBatch,
    cos: np.ndarray,
    sin: np.ndarray,
    scale: float,
    row_scale: np.ndarray | None,
) -> np.ndarray:
    """The expanded MLA forward of this step's tokens ``x [T, hidden]``; cached positions' latent rows
    are read from the cache (as written by earlier steps, already rotated)."""
    s, meta = ck.shape, batch.host_meta
    q = (x @ ck.q.T) if ck.q_a is None else oracle_rms(x @ ck.q_a.T, ck.q_a_norm, ck.eps) @ ck.q.T
    q = q.reshape(len(x), s.heads, s.nope_dim + s.rope_dim)
    kv = x @ ck.kv_a.T + ck.kv_a_bias
    latent, k_rope = oracle_rms(kv[:, :LATENT], ck.kv_a_norm, ck.eps), kv[:, LATENT:]
    kv_b = ck.kv_b.reshape(s.heads, s.nope_dim + s.v_dim, LATENT)
    out = np.zeros((len(x), ck.o.shape[0]))
    for b in range(meta.num_seqs):
        start, end, ctx = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1]), int(meta.seq_lens[b])
        cached = ctx - (end - start)
        table = meta.block_tables[b]
        rows = [batch.k_cache[table[p // batch.block_size], p % batch.block_size, 0] for p in range(cached)]
        for t in range(start, end):
            position = cached + t - start
            rows.append(np.concatenate([latent[t], oracle_interleaved_rope(k_rope[t], position, cos, sin)]))
        context = np.stack(rows)  # [ctx, L + R]: latent | rotated shared key
        for t in range(start, end):
            position = cached + t - start
            factor = scale * (1.0 if row_scale is None else row_scale[position])
            heads_out = []
            for h in range(s.heads):
                keys_nope = context[: position + 1, :LATENT] @ kv_b[h, : s.nope_dim].T
                values = context[: position + 1, :LATENT] @ kv_b[h, s.nope_dim :].T
                keys = np.concatenate([keys_nope, context[: position + 1, LATENT:]], axis=1)
                query = np.concatenate(
                    [q[t, h, : s.nope_dim], oracle_interleaved_rope(q[t, h, s.nope_dim :], position, cos, sin)]
                )
                scores = keys @ query * factor
                weights = np.exp(scores - scores.max())
                heads_out.append(weights @ values / weights.sum())
            out[t] = ck.o @ np.concatenate(heads_out)
    return out


def layer_weights(case: Case, ck: Checkpoint) -> MLAWeights:
    """What the loader makes of the checkpoint: fused input GEMM, rotate-half rope rows, split kv_b."""
    s, backend = ck.shape, case.backend
    head = s.nope_dim + s.rope_dim
    q = deinterleave_rope_rows(ck.q, group=head, start=s.nope_dim, rope_dim=s.rope_dim)
    kv_a = deinterleave_rope_rows(ck.kv_a, group=LATENT + ROPE, start=LATENT, rope_dim=ROPE)
    kv_bias = deinterleave_rope_rows(ck.kv_a_bias, group=LATENT + ROPE, start=LATENT, rope_dim=ROPE)
    q_in = q if ck.q_a is None else ck.q_a
    uk, uv = split_kv_b(ck.kv_b, s)

    def upload(array: np.ndarray) -> object:
        return backend.from_numpy(array.astype(np.float32), weight=True)

    return MLAWeights(
        fused_in=upload(np.concatenate([q_in, kv_a])),
        fused_in_bias=upload(np.concatenate([np.zeros(len(q_in)), kv_bias])),
        kv_a_norm=RMSNorm(backend, upload(ck.kv_a_norm), ck.eps),
        q_b=None if ck.q_a is None else upload(q),
        q_a_norm=None if ck.q_a is None else RMSNorm(backend, upload(ck.q_a_norm), ck.eps),
        uk=upload(uk),
        uv=upload(uv),
        o=upload(ck.o),
    )


@pytest.mark.parametrize("position_scaled", [False, True], ids=["plain", "position-scale"])
@pytest.mark.parametrize("q_lora_rank", [None, 12], ids=["q_proj", "q_lora"])
@pytest.mark.parametrize("scenario", ["mixed", "decode_batch", "prefill"])
def test_absorbed_layer_matches_expanded_mla(
    case: Case, scenario: str, q_lora_rank: int | None, position_scaled: bool
) -> None:
    hidden = 20
    ck = random_checkpoint(case, hidden, q_lora_rank)
    # the checkpoint as the backend holds it (the oracle must not count weight rounding)
    ck = dataclasses.replace(
        ck,
        **{
            f.name: case.host(case.backend.from_numpy(getattr(ck, f.name), weight=True))
            for f in dataclasses.fields(ck)
            if isinstance(getattr(ck, f.name), np.ndarray)
        },
    )
    batch = paged_batch(case, scenario, 1, LATENT + ROPE)
    tokens = len(batch.positions)
    x_dev, x = case.upload(case.normal(tokens, hidden))
    tables = rope_tables(case, ROPE)
    scale = float(case.rng.uniform(0.7, 1.5)) * (ck.shape.nope_dim + ROPE) ** -0.5
    position_scale_dev, position_scale = None, None
    if position_scaled:
        position_scale_dev, position_scale = case.upload(1.0 + 0.1 * np.log1p(np.arange(64) // 5).astype(np.float32))
    layer = MultiHeadLatentAttention(
        case.backend,
        layer_weights(case, ck),
        layer_index=0,
        shape=ck.shape,
        rope_cos=tables.cos_dev,
        rope_sin=tables.sin_dev,
        scale=scale,
        position_scale=position_scale_dev,
    )
    kv = KVCache(case.backend, [LatentKVLayout(LATENT, ROPE)], KVPlan(batch.k_cache.shape[0], batch.block_size, 0))
    assert kv.values == [None], f"a latent layout has no value array {case.tag}"
    kv.keys[0] = batch.k_cache_dev
    forward = ForwardBatch(
        input_ids=case.backend.from_numpy(np.zeros(tokens, dtype=np.int32)),
        positions=case.backend.from_numpy(batch.positions.astype(np.int32)),
        attention=batch.meta,
        logits_rows=np.zeros(0, dtype=np.int64),
        state_slots=case.backend.from_numpy(np.full(batch.host_meta.num_seqs, -1, dtype=np.int32)),
    )
    want = oracle_mla(ck, x, batch, tables.cos, tables.sin, scale, position_scale)
    got = layer(x_dev, forward, kv)
    wide = dataclasses.replace(
        case,
        tol=dataclasses.replace(
            case.tol, rtol=case.tol.rtol * PIPELINE_TOLERANCE_FACTOR, atol=case.tol.atol * PIPELINE_TOLERANCE_FACTOR
        ),
    )
    wide.assert_close(
        got, want, f"absorbed MLA layer vs expanded MLA ({scenario}, q_lora_rank={q_lora_rank}, {batch.describe()})"
    )
