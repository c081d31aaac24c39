"""Backend conformance of fp8 (E4M3) KV caches (``kv_cache_dtype="fp8"``), for every installed backend.

A backend listing ``fp8`` in `Backend.kv_cache_dtypes` is checked op by op: `write_kv_scaled` stores exactly the
bytes of `atlas_core.backends.kv_dtypes.quantize_kv` (saturation and subnormals included), the fused
`qk_norm_rope_write_kv` with ``kv_scales`` stores its rotated keys within E4M3's rounding of the float64 oracle,
and `attention_scaled` matches the float64 oracle run over the dequantized caches. A backend that does not list
it must refuse the scaled ops with `NotImplementedError`.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.base import Array
from atlas_core.backends.kv_dtypes import FP8_E4M3, dequantize_kv, quantize_kv
from atlas_core.model.layers.attention import fused_inputs_take_scales
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.oracles import MAX_POSITIONS, oracle_rope, rope_tables
from tests.test_conformance_attention import (
    PagedBatch,
    oracle_attention,
    oracle_head_norm,
    oracle_write_kv,
    paged_batch,
    skip_pattern,
)

E4M3_RELATIVE = 2.0**-4
"""Half a unit in the last place of E4M3's 3-bit mantissa: the largest relative rounding of a normal value."""
E4M3_SUBNORMAL_STEP = 2.0**-9
"""E4M3's subnormal spacing (times the scale): the largest absolute rounding near zero is half of it."""


def holds_fp8(case: Case) -> bool:
    """Whether the backend holds fp8 caches; one that does not must refuse the scaled ops."""
    if "fp8" in case.backend.kv_cache_dtypes:
        return True
    with pytest.raises(NotImplementedError, match=case.backend.name):
        case.backend.write_kv_scaled(None, None, None, None, None, 1.0, 1.0)  # type: ignore[arg-type]
    return False


def stored_bytes(case: Case, cache: Array) -> np.ndarray:
    """A cache's E4M3 bytes on the host (a backend may hold them as float8 or as uint8)."""
    return np.ascontiguousarray(case.raw(cache)).view(np.uint8)


def fp8_cache(case: Case, values: np.ndarray, scale: float) -> Array:
    """A backend fp8 cache ``[blocks, block_size, heads, dim]`` holding ``values`` (float64), written by the
    backend's own `write_kv_scaled` into every slot (the test of that op checks its bytes)."""
    blocks, block_size, heads, dim = values.shape
    k_cache = case.backend.zeros(values.shape, FP8_E4M3)
    v_cache = case.backend.zeros(values.shape, FP8_E4M3)
    rows = case.backend.from_numpy(values.reshape(-1, heads, dim).astype(np.float32))
    slots = case.backend.from_numpy(np.arange(blocks * block_size, dtype=np.int32))
    case.backend.write_kv_scaled(k_cache, v_cache, rows, rows, slots, scale, scale)
    return k_cache


def wide_range_rows(case: Case, tokens: int, heads: int, dim: int, scale: float) -> np.ndarray:
    """Rows around ``scale`` with a few values past E4M3's ±448 x scale (saturated) and a few in its subnormal
    range (below 2^-6 x scale)."""
    rows = case.normal(tokens, heads, dim, scale=8.0 * scale)
    flat = rows.reshape(-1)
    picks = case.rng.permutation(flat.size)
    flat[picks[:3]] = np.float32(2000.0 * scale) * np.sign(case.rng.standard_normal(3)).astype(np.float32)
    flat[picks[3:9]] = case.normal(6, scale=0.004 * scale)
    return rows


@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim"), [(1, 2, 16), (11, 2, 12), (9, 1, 64)])
def test_write_kv_scaled_stores_the_e4m3_bytes(case: Case, tokens: int, kv_heads: int, head_dim: int) -> None:
    if not holds_fp8(case):
        return
    num_blocks, block_size = 6, 5
    k_scale, v_scale = float(case.rng.uniform(0.02, 0.5)), float(case.rng.uniform(0.02, 0.5))
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = fp8_cache(case, case.normal(*shape).astype(np.float64), k_scale)
    v_cache = fp8_cache(case, case.normal(*shape).astype(np.float64), v_scale)
    before = [stored_bytes(case, c) for c in (k_cache, v_cache)]
    slots = case.rng.permutation(num_blocks * block_size)[:tokens]
    slots[skip_pattern(case, tokens, "mixed" if tokens > 2 else "write")] = -1
    k_dev, k = case.upload(wide_range_rows(case, tokens, kv_heads, head_dim, k_scale))
    v_dev, v = case.upload(wide_range_rows(case, tokens, kv_heads, head_dim, v_scale))
    slots_dev, slots = case.upload(slots.astype(np.int32))
    assert case.backend.write_kv_scaled(k_cache, v_cache, k_dev, v_dev, slots_dev, k_scale, v_scale) is None
    for name, cache, old, new, scale in (("k", k_cache, before[0], k, k_scale), ("v", v_cache, before[1], v, v_scale)):
        want = oracle_write_kv(old, quantize_kv(new.astype(np.float32), FP8_E4M3, scale).view(np.uint8), slots)
        case.assert_equal(stored_bytes(case, cache), want, f"write_kv_scaled {name} bytes (scale {scale})")


@pytest.mark.parametrize(("tokens", "q_heads", "kv_heads", "head_dim"), [(1, 4, 2, 16), (7, 4, 1, 40), (150, 4, 2, 64)])
def test_fused_attention_inputs_into_fp8_caches(
    case: Case, tokens: int, q_heads: int, kv_heads: int, head_dim: int
) -> None:
    """`qk_norm_rope_write_kv` with ``kv_scales``: queries as for bf16 caches; the cache holds E4M3 roundings of the
    normed, rotated keys divided by the key scale, and exactly the E4M3 bytes of the values."""
    if not holds_fp8(case) or not fused_inputs_take_scales(type(case.backend)):
        return  # a fused op without kv_scales is never given fp8 caches (the attention layer checks)
    block_size, eps = 5, 1e-5
    num_blocks = max(8, -(-tokens // block_size))  # a slot for each token
    k_scale, v_scale = float(case.rng.uniform(0.05, 0.5)), float(case.rng.uniform(0.05, 0.5))
    positions = case.rng.integers(0, MAX_POSITIONS, size=tokens)
    slots = case.rng.permutation(num_blocks * block_size)[:tokens]
    slots[skip_pattern(case, tokens, "mixed" if tokens > 2 else "write")] = -1
    pos_dev, pos = case.upload(positions.astype(np.int32))
    slots_dev, slots = case.upload(slots.astype(np.int32))
    tables = rope_tables(case, head_dim)
    q_dev, q = case.upload(case.normal(tokens, q_heads, head_dim, scale=2.0))
    k_dev, k = case.upload(case.normal(tokens, kv_heads, head_dim, scale=2.0))
    v_dev, v = case.upload(case.normal(tokens, kv_heads, head_dim, scale=2.0))
    (qw_dev, qw), (kw_dev, kw) = (case.upload(case.normal(head_dim) + 1.0, weight=True) for _ in "qk")
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = fp8_cache(case, case.normal(*shape).astype(np.float64), k_scale)
    v_cache = fp8_cache(case, case.normal(*shape).astype(np.float64), v_scale)
    k_before, v_before = stored_bytes(case, k_cache), stored_bytes(case, v_cache)
    got = case.backend.qk_norm_rope_write_kv(
        q_dev,
        k_dev,
        v_dev,
        qw_dev,
        kw_dev,
        eps,
        pos_dev,
        tables.cos_dev,
        tables.sin_dev,
        k_cache,
        v_cache,
        slots_dev,
        kv_scales=(k_scale, v_scale),
    )
    case.assert_close(got, oracle_rope(oracle_head_norm(q, qw, eps), pos, tables.cos, tables.sin), "queries")
    want_k = oracle_rope(oracle_head_norm(k, kw, eps), pos, tables.cos, tables.sin)
    old_keys = dequantize_kv(k_before.view(FP8_E4M3), k_scale).astype(np.float64)
    want = oracle_write_kv(old_keys, want_k, slots)
    keys = dequantize_kv(stored_bytes(case, k_cache).view(FP8_E4M3), k_scale).astype(np.float64)
    bound = (E4M3_RELATIVE + case.tol.rtol) * np.abs(want) + k_scale * E4M3_SUBNORMAL_STEP / 2 + case.tol.atol
    excess = np.abs(keys - want) - bound
    assert (excess <= 0).all(), f"keys off by more than E4M3's rounding at {np.argwhere(excess > 0)[:3]} {case.tag}"
    want_v = oracle_write_kv(v_before, quantize_kv(v.astype(np.float32), FP8_E4M3, v_scale).view(np.uint8), slots)
    case.assert_equal(stored_bytes(case, v_cache), want_v, "value bytes")


def scaled_caches(case: Case, batch: PagedBatch) -> tuple[Array, Array, np.ndarray, np.ndarray, float, float]:
    """The batch's caches stored as fp8 with random scales, and what they hold (dequantized, float64)."""
    k_scale, v_scale = float(case.rng.uniform(0.05, 0.4)), float(case.rng.uniform(0.05, 0.4))
    k_cache = fp8_cache(case, batch.k_cache, k_scale)
    v_cache = fp8_cache(case, batch.v_cache, v_scale)
    keys = dequantize_kv(stored_bytes(case, k_cache).view(FP8_E4M3), k_scale).astype(np.float64)
    values = dequantize_kv(stored_bytes(case, v_cache).view(FP8_E4M3), v_scale).astype(np.float64)
    return k_cache, v_cache, keys, values, k_scale, v_scale


@pytest.mark.parametrize(("group", "head_dim"), [(1, 16), (4, 16), (2, 12)], ids=["mha", "gqa4", "gqa2_d12"])
@pytest.mark.parametrize("scenario", ["mixed", "decode_batch", "prefill"])
@pytest.mark.parametrize("window", [None, 4])
def test_attention_over_fp8_caches(case: Case, scenario: str, group: int, head_dim: int, window: int | None) -> None:
    if not holds_fp8(case):
        return
    kv_heads = 2
    batch = paged_batch(case, scenario, kv_heads, head_dim)
    k_cache, v_cache, keys, values, k_scale, v_scale = scaled_caches(case, batch)
    q_dev, q = case.upload(case.normal(len(batch.positions), kv_heads * group, head_dim, scale=1.5))
    want = oracle_attention(q, keys, values, batch.host_meta, batch.scale, sliding_window=window)
    got = case.backend.attention_scaled(
        q_dev, k_cache, v_cache, batch.meta, batch.scale, k_scale, v_scale, sliding_window=window
    )
    case.assert_close(got, want, f"attention_scaled ({scenario}, window {window}, {batch.describe()})")
