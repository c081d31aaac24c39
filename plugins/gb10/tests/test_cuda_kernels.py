"""The cuda backend's kernels beyond the shared conformance suite and the products (test_cuda_products.py): rows
computed the same way in any batch (RMSNorm, attention in the batch-invariant mode, the tensor-core prefill and
decode outside it), split-K and direct attention giving the same bits. Needs a CUDA GPU; skipped with the
backend's own reason elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def host(backend: CudaBackend, x: object) -> np.ndarray:
    return np.asarray(backend.to_numpy(x)).astype(np.float64)


def test_rms_norm_rows_do_not_depend_on_the_batch(backend: CudaBackend) -> None:
    rng = np.random.default_rng(1)
    for hidden in (64, 2048):
        x = backend.from_numpy(rng.standard_normal((50, hidden), dtype=np.float32))
        r = backend.from_numpy(rng.standard_normal((50, hidden), dtype=np.float32))
        w = backend.from_numpy(rng.standard_normal(hidden, dtype=np.float32), weight=True)
        full = [host(backend, a) for a in backend.rms_norm(x, w, 1e-6, r)]
        part = [host(backend, a) for a in backend.rms_norm(x[10:13], w, 1e-6, r[10:13])]
        for got, want in zip(part, full, strict=True):
            np.testing.assert_array_equal(got, want[10:13])


def paged(
    backend: CudaBackend,
    rng: np.random.Generator,
    lengths: list[tuple[int, int]],
    kv_heads: int,
    d: int,
    block_size: int = 16,
) -> tuple:
    """A batch over shuffled blocks: (meta on the device, token count, caches)."""
    from atlas_core.backends.base import AttentionMetadata

    needed = [-(-(c + n) // block_size) for c, n in lengths]
    pool = rng.permutation(sum(needed) + 2)
    tables = np.full((len(lengths), max(needed)), -1, dtype=np.int32)
    starts, offset = [0], 0
    for b, (_cached, new) in enumerate(lengths):
        tables[b, : needed[b]] = pool[offset : offset + needed[b]]
        offset += needed[b]
        starts.append(starts[-1] + new)
    meta = AttentionMetadata(
        backend.from_numpy(np.asarray(starts, dtype=np.int32)),
        backend.from_numpy(np.asarray([c + n for c, n in lengths], dtype=np.int32)),
        backend.from_numpy(tables),
        backend.from_numpy(np.zeros(starts[-1], dtype=np.int32)),
    )
    shape = (len(pool), block_size, kv_heads, d)
    caches = [backend.from_numpy(rng.standard_normal(shape, dtype=np.float32)) for _ in range(2)]
    return meta, starts[-1], caches


@contextmanager
def batch_invariant_mode(backend: CudaBackend) -> Iterator[None]:
    """The backend as an engine with ``batch_invariant=True`` sets it: the invariant kernels only."""
    backend.batch_invariant = True
    try:
        yield
    finally:
        backend.batch_invariant = False


def under_split_policies(backend: CudaBackend, run: Callable[[], object]) -> dict[str, np.ndarray]:
    """``run()``'s result (on the host) with attention cut into splits "never" and "always", in the
    batch-invariant mode (the tensor-core prefill kernel has no split mode)."""
    runner = backend.attention_runner
    results = {}
    try:
        with batch_invariant_mode(backend):
            for policy in ("never", "always"):
                runner.split_policy = policy
                results[policy] = host(backend, run())
    finally:
        runner.split_policy = "auto"
    return results


@pytest.mark.parametrize(("d", "window"), [(128, None), (72, None), (64, 300), (256, None)])
def test_tensor_core_prefill_rows_do_not_depend_on_the_batch(backend: CudaBackend, d: int, window: int | None) -> None:
    """attention_mma.cu (prefill items of 64 rows, outside the batch-invariant mode): within bf16 tolerance of
    the invariant kernel over contexts of many key tiles, and a sequence's rows get the same bits alone as
    beside other sequences."""
    from atlas_gb10.attention import mma_shared_bytes

    if mma_shared_bytes(-(-d // 16)) > backend.profile.shared_memory_per_block:
        pytest.skip(f"{d}-wide heads: this device's shared memory per block cannot hold the tensor-core tiles")
    rng = np.random.default_rng(d)
    kv_heads, group = 2, 4
    lengths = [(700, 37), (0, 300), (1500, 90)]
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, lengths, kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    fast = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    with batch_invariant_mode(backend):
        invariant = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    assert np.isfinite(fast).all()
    assert np.abs(fast - invariant).max() <= 2e-2 * np.abs(invariant).max()
    assert not np.array_equal(fast, invariant), "the prefill did not take the tensor-core kernel"
    from atlas_core.backends.base import AttentionMetadata

    fields = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping")
    host_meta = AttentionMetadata(*(backend.to_numpy(getattr(meta, f)) for f in fields))
    first, last = int(host_meta.query_start_loc[1]), int(host_meta.query_start_loc[2])
    alone = AttentionMetadata(
        backend.from_numpy(np.asarray([0, last - first], dtype=np.int32)),
        backend.from_numpy(host_meta.seq_lens[1:2].copy()),
        backend.from_numpy(host_meta.block_tables[1:2].copy()),
        backend.from_numpy(host_meta.slot_mapping[first:last].copy()),
    )
    single = host(backend, backend.attention(q[first:last], k_cache, v_cache, alone, d**-0.5, sliding_window=window))
    np.testing.assert_array_equal(single, fast[first:last])


@pytest.mark.parametrize(("d", "group", "window"), [(128, 4, None), (64, 8, 300), (80, 3, None)])
def test_tensor_core_prefill_items_of_64_and_128_rows_give_the_same_bits(
    backend: CudaBackend, d: int, group: int, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attention_mma.cu's 128-row items (warps of 32 rows: `AttentionRunner.mma_rows` on devices whose shared
    memory holds them) give every row the bits of its 64-row items, ragged query tiles and GQA groups that do not
    divide the rows included."""
    runner = backend.attention_runner
    steps = -(-d // 16)
    if runner.mma_rows(steps) != 128:
        pytest.skip(f"{d}-wide heads: this device's shared memory per block cannot hold 128-row tiles")
    rng = np.random.default_rng(d + group)
    kv_heads = 2
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, [(700, 77), (0, 300), (1500, 129)], kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    monkeypatch.setattr(runner, "wgmma_prefill", False)  # attention_mma.cu's _x2 kernel, not attention_wgmma.cu
    wide = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    monkeypatch.setattr(runner, "mma_rows", lambda steps: 64)
    narrow = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    assert np.isfinite(wide).all()
    np.testing.assert_array_equal(wide, narrow)


@pytest.mark.parametrize(("d", "group", "window"), [(128, 4, None), (120, 3, 300), (128, 8, None), (116, 4, None)])
def test_wgmma_prefill_matches_the_mma_kernel(
    backend: CudaBackend, d: int, group: int, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attention_wgmma.cu (Hopper) within bf16 tolerance of attention_mma.cu's 128-row kernel: heads padded to 128
    (116: not a multiple of 8, so element-wise copies), GQA groups that do not divide the rows, an item whose second
    warpgroup has no rows, a sliding window; and a sequence's rows get the same bits alone as beside other
    sequences."""
    runner = backend.attention_runner
    if not runner.wgmma_prefill:
        pytest.skip(f"wgmma needs Hopper (sm_90a), this device compiles for {backend.profile.arch}")
    rng = np.random.default_rng(d + group)
    kv_heads = 2
    lengths = [(700, 77), (0, 300), (1500, 129), (64, 5)]
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, lengths, kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    kernels, function = backend.kernels, backend.kernels.function
    taken: list[str] = []
    monkeypatch.setattr(
        kernels, "function", lambda op, name, dtype="bf16": taken.append(name) or function(op, name, dtype)
    )
    fast = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    assert taken == ["attention_wgmma_d8"]
    monkeypatch.setattr(runner, "wgmma_prefill", False)
    mma = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    assert taken[1:] == ["attention_mma_d8_x2"]
    monkeypatch.setattr(runner, "wgmma_prefill", True)
    assert np.isfinite(fast).all()
    assert np.abs(fast - mma).max() <= 2e-2 * np.abs(mma).max()
    from atlas_core.backends.base import AttentionMetadata

    starts, lens = backend.to_numpy(meta.query_start_loc), backend.to_numpy(meta.seq_lens)
    tables = backend.to_numpy(meta.block_tables)
    first, last = int(starts[2]), int(starts[3])
    alone = AttentionMetadata(
        backend.from_numpy(np.asarray([0, last - first], dtype=np.int32)),
        backend.from_numpy(lens[2:3].copy()),
        backend.from_numpy(tables[2:3].copy()),
        backend.from_numpy(np.zeros(last - first, dtype=np.int32)),
    )
    single = host(backend, backend.attention(q[first:last], k_cache, v_cache, alone, d**-0.5, sliding_window=window))
    np.testing.assert_array_equal(single, fast[first:last])


@pytest.mark.parametrize("window", [None, 300])
def test_attention_split_and_direct_modes_give_the_same_bits(backend: CudaBackend, window: int | None) -> None:
    rng = np.random.default_rng(2)
    kv_heads, group, d = 2, 4, 128
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, [(1500, 1), (700, 37), (0, 90), (2100, 1)], kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    results = under_split_policies(
        backend, lambda: backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window)
    )
    assert np.isfinite(results["never"]).all()
    np.testing.assert_array_equal(results["always"], results["never"])


@pytest.mark.parametrize(("d", "group", "window"), [(128, 8, None), (64, 2, 300), (256, 4, None), (128, 16, 100)])
def test_tensor_core_decode_attention_matches_numpy(
    backend: CudaBackend, d: int, group: int, window: int | None
) -> None:
    """attention_decode.cu (16-row items outside the batch-invariant mode): decode tokens over contexts of 1 to
    2,100 keys (split boundaries at 64, 65) and a verify step's tokens, against the NumPy backend within bf16
    tolerance, every output row written over a NaN-poisoned buffer; split and direct mode give the same bits,
    and so does a sequence alone."""
    from atlas_core.backends.base import AttentionMetadata
    from atlas_core.backends.numpy_backend import NumpyBackend

    rng = np.random.default_rng(d + group)
    kv_heads = 2
    lengths = [(1500, 1), (0, 1), (64, 1), (65, 1), (2100, 1), (200, 16 // group)]
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, lengths, kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    runner, results = backend.attention_runner, {}
    try:
        for policy in ("never", "always"):
            runner.split_policy = policy
            out = backend.from_numpy(np.full((tokens, kv_heads * group, d), np.nan, dtype=np.float32))
            results[policy] = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, out, window))
    finally:
        runner.split_policy = "auto"
    np.testing.assert_array_equal(results["always"], results["never"])
    fields = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping")
    host_meta = AttentionMetadata(*(backend.to_numpy(getattr(meta, f)) for f in fields))
    inputs = (host(backend, a).astype(np.float32) for a in (q, k_cache, v_cache))
    want = NumpyBackend().attention(*inputs, host_meta, d**-0.5, sliding_window=window)
    assert np.abs(results["never"] - want).max() <= 2e-2 * np.abs(want).max()
    with batch_invariant_mode(backend):
        invariant = host(backend, backend.attention(q, k_cache, v_cache, meta, d**-0.5, sliding_window=window))
    assert not np.array_equal(invariant, results["never"]), "the decode did not take the tensor-core kernel"
    alone = AttentionMetadata(
        backend.from_numpy(np.array([0, 1], dtype=np.int32)),
        meta.seq_lens[4:5],
        meta.block_tables[4:5],
        meta.slot_mapping[4:5],
    )
    single = host(backend, backend.attention(q[4:5], k_cache, v_cache, alone, d**-0.5, sliding_window=window))
    np.testing.assert_array_equal(single[0], results["never"][4])


@pytest.mark.parametrize(
    ("lengths", "d"), [([(1500, 1), (700, 1), (3, 1)], 128), ([(700, 37), (0, 300)], 128), ([(90, 1)], 72)]
)
def test_fp8_caches_attend_as_the_bf16_values_they_hold(backend: CudaBackend, lengths: list, d: int) -> None:
    """With power-of-two scales every fp8 key and value times its scale is a bf16 value, and the fp8 kernels
    (key scale folded into the softmax scale, value scale on the output) give the bits the bf16 kernels give
    over those values: decode in split and direct mode, the tensor-core prefill, and heads of 72 (byte loads)."""
    from atlas_core.backends.kv_dtypes import FP8_E4M3, dequantize_kv, quantize_kv

    rng = np.random.default_rng(d + len(lengths))
    kv_heads, group, scales = 2, 4, (0.25, 2.0)
    meta, tokens, caches = paged(backend, rng, lengths, kv_heads, d)
    stored = [
        quantize_kv(host(backend, c).astype(np.float32), FP8_E4M3, s) for c, s in zip(caches, scales, strict=True)
    ]
    fp8 = [backend.from_numpy(a.view(np.uint8), dtype=np.dtype(np.uint8)) for a in stored]
    exact = [backend.from_numpy(dequantize_kv(a, s)) for a, s in zip(stored, scales, strict=True)]
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    got = host(backend, backend.attention_scaled(q, *fp8, meta, d**-0.5, *scales))
    want = host(backend, backend.attention(q, *exact, meta, d**-0.5))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)
    splits = under_split_policies(backend, lambda: backend.attention_scaled(q, *fp8, meta, d**-0.5, *scales))
    np.testing.assert_array_equal(splits["always"], splits["never"])
    with batch_invariant_mode(backend):
        np.testing.assert_array_equal(splits["never"], host(backend, backend.attention(q, *exact, meta, d**-0.5)))


def test_attention_of_512_wide_heads_matches_the_numpy_backend(backend: CudaBackend) -> None:
    """Gemma 4's global layers: 512-wide heads (16-row blocks, one key/value buffer, the running output in
    registers) with GQA 8, against the NumPy backend; split-K and direct mode give the same bits."""
    from atlas_core.backends.base import AttentionMetadata
    from atlas_core.backends.numpy_backend import NumpyBackend

    rng = np.random.default_rng(4)
    kv_heads, group, d = 2, 8, 512
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, [(300, 1), (0, 40), (70, 1)], kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    results = under_split_policies(backend, lambda: backend.attention(q, k_cache, v_cache, meta, d**-0.5))
    np.testing.assert_array_equal(results["always"], results["never"])
    fields = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping")
    host_meta = AttentionMetadata(*(backend.to_numpy(getattr(meta, f)) for f in fields))
    inputs = (host(backend, a).astype(np.float32) for a in (q, k_cache, v_cache))
    want = NumpyBackend().attention(*inputs, host_meta, d**-0.5)
    assert np.abs(results["never"] - want).max() <= 2e-2 * np.abs(want).max()


def test_attention_rows_do_not_depend_on_the_batch(backend: CudaBackend) -> None:
    """In the batch-invariant mode, a decode token attends the same alone and beside a prefill chunk and other
    decodes."""
    rng = np.random.default_rng(3)
    kv_heads, group, d = 8, 2, 64
    meta, tokens, (k_cache, v_cache) = paged(backend, rng, [(40, 25), (900, 1), (3, 1)], kv_heads, d)
    q = backend.from_numpy(rng.standard_normal((tokens, kv_heads * group, d), dtype=np.float32))
    with batch_invariant_mode(backend):
        together = host(backend, backend.attention(q, k_cache, v_cache, meta, 0.1))
    from atlas_core.backends.base import AttentionMetadata

    alone_meta = AttentionMetadata(
        backend.from_numpy(np.array([0, 1], dtype=np.int32)),
        meta.seq_lens[1:2],
        meta.block_tables[1:2],
        meta.slot_mapping[25:26],
    )
    with batch_invariant_mode(backend):
        alone = host(backend, backend.attention(q[25:26], k_cache, v_cache, alone_meta, 0.1))
    np.testing.assert_array_equal(alone[0], together[25])
