"""Per-layer KV layouts: standard K/V and the MLA latent layout side by side in one cache, sized exactly."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.batch.kv_cache import KVCache, KVCacheTooSmallError, KVLayout, LatentKVLayout, plan_kv_cache

MIXED = [KVLayout(2, 16), LatentKVLayout(32, 8), KVLayout(1, 8, dtype=np.dtype(np.float16)), LatentKVLayout(32, 8)]
MIXED_BYTES = 2 * 2 * 16 * 4 + (32 + 8) * 4 + 2 * 1 * 8 * 2 + (32 + 8) * 4


def test_bytes_per_token_count_what_each_layout_stores() -> None:
    assert KVLayout(2, 16).bytes_per_token(np.dtype(np.float32)) == 2 * 2 * 16 * 4
    assert LatentKVLayout(32, 8).bytes_per_token(np.dtype(np.float32)) == 40 * 4
    assert LatentKVLayout(512, 64, dtype=np.dtype(np.float16)).bytes_per_token(np.dtype(np.float32)) == 576 * 2
    plan = plan_kv_cache(MIXED, np.dtype(np.float32), 16, 100 * 16 * MIXED_BYTES, 64, "test budget")
    assert (plan.bytes_per_token, plan.num_blocks) == (MIXED_BYTES, 100)


def test_sizing_error_is_exact_for_mixed_layouts() -> None:
    block_bytes = 16 * MIXED_BYTES
    with pytest.raises(KVCacheTooSmallError) as excinfo:
        plan_kv_cache(MIXED, np.dtype(np.float32), 16, 3 * block_bytes + block_bytes - 1, 64, "kv_cache_memory_gib=x")
    message = str(excinfo.value)
    assert f"({MIXED_BYTES} bytes per token over 4 layers: 1 x K/V 2x16, 2 x MLA latent 32+8, 1 x K/V 1x8)" in message
    assert "which holds 3 blocks of 16 tokens" in message and "one sequence needs 4 blocks" in message
    assert "Lower max_seq_len to at most 48" in message


def test_single_kind_message_is_unchanged() -> None:
    with pytest.raises(KVCacheTooSmallError, match=r"\(256 bytes per token over 2 layers\)"):
        plan_kv_cache([KVLayout(1, 16)] * 2, np.dtype(np.float32), 4, 0, 8, "b")


def test_cache_allocates_keys_and_values_per_layout_and_copies_blocks() -> None:
    backend = NumpyBackend()
    plan = plan_kv_cache(MIXED, np.dtype(np.float32), 4, 5 * 4 * MIXED_BYTES, 8, "b")
    kv = KVCache(backend, MIXED, plan)
    assert [k.shape for k in kv.keys] == [(5, 4, 2, 16), (5, 4, 1, 40), (5, 4, 1, 8), (5, 4, 1, 40)]
    assert [None if v is None else v.shape for v in kv.values] == [(5, 4, 2, 16), None, (5, 4, 1, 8), None]
    assert kv.keys[2].dtype == np.float16 and kv.keys[1].dtype == np.float32
    rng = np.random.default_rng(0)
    for array in (*kv.keys, *(v for v in kv.values if v is not None)):
        array[...] = rng.standard_normal(array.shape)
    before = [k.copy() for k in kv.keys]
    kv.copy_blocks([(1, 3), (4, 0)])
    for old, new in zip(before, kv.keys, strict=True):
        np.testing.assert_array_equal(new[[3, 0]], old[[1, 4]])
        np.testing.assert_array_equal(new[[1, 2, 4]], old[[1, 2, 4]])
