"""The cuda backend's ``mla`` op group beyond the shared conformance suite: shapes that do not divide the
kernels' tiles (head counts, latent and rotary widths, K and N of the per-head products), contexts on and
across split boundaries, DeepSeek-V3's real widths, rows bit-identical whatever the batch and whichever
plan runs them (split or direct, eager or a captured graph's static plan), and a captured replay equal to
the eager call. Needs a CUDA GPU."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core.backends.base import AttentionMetadata
from atlas_core.backends.ops.mla import MLAOps, latent_attention_reference

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


@pytest.fixture(scope="module")
def mla(backend: CudaBackend) -> MLAOps:
    ops = backend.ops(MLAOps)
    assert type(ops).__name__ == "CudaMLAOps", "the cuda backend must resolve its native mla implementation"
    return ops


def host(backend: CudaBackend, x: object) -> np.ndarray:
    return np.asarray(backend.to_numpy(x)).astype(np.float64)


def latent_batch(
    backend: CudaBackend, rng: np.random.Generator, lengths: list[tuple[int, int]], width: int, block_size: int
) -> tuple[AttentionMetadata, AttentionMetadata, object, int]:
    """(device meta, host meta, latent cache over shuffled blocks, tokens) for (cached, new) per sequence."""
    needed = [-(-(c + n) // block_size) for c, n in lengths]
    pool = rng.permutation(sum(needed) + 3)
    tables = np.full((len(lengths), max(needed) + 1), -1, dtype=np.int32)
    starts, offset = [0], 0
    for b, (_cached, new) in enumerate(lengths):
        tables[b, : needed[b]] = pool[offset : offset + needed[b]]
        offset += needed[b]
        starts.append(starts[-1] + new)
    host_meta = AttentionMetadata(
        np.asarray(starts, dtype=np.int32),
        np.asarray([c + n for c, n in lengths], dtype=np.int32),
        tables,
        np.full(starts[-1], -1, dtype=np.int32),
    )
    meta = AttentionMetadata(
        *(
            backend.from_numpy(getattr(host_meta, f))
            for f in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping")
        )
    )
    cache = backend.from_numpy(rng.standard_normal((len(pool), block_size, 1, width), dtype=np.float32))
    return meta, host_meta, cache, starts[-1]


def queries(backend: CudaBackend, rng: np.random.Generator, tokens: int, heads: int, latent: int, rope: int) -> tuple:
    """q_latent [T, H, L] and q_rope as a strided view of a wider array, as the layer passes it."""
    q_latent = backend.from_numpy(rng.standard_normal((tokens, heads, latent), dtype=np.float32) * latent**-0.5)
    wide = backend.from_numpy(rng.standard_normal((tokens, heads, rope + 5), dtype=np.float32) * 0.3)
    return q_latent, wide[:, :, 5:]


def attend(backend: CudaBackend, mla: MLAOps, policy: str, *args: object, **kwargs: object) -> np.ndarray:
    runner = backend.attention_runner
    runner.split_policy = policy
    try:
        return host(backend, mla.mla_attention(*args, **kwargs))
    finally:
        runner.split_policy = "auto"


# ---- per-head products -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("heads", "k", "n"),
    [(3, 13, 9), (5, 40, 24), (4, 16, 32), (2, 512, 128), (128, 128, 512)],
    ids=["odd", "strided", "tiny-ds", "uv", "deepseek-uk"],
)
def test_head_linear_matches_and_rows_do_not_depend_on_the_batch(
    backend: CudaBackend, mla: MLAOps, heads: int, k: int, n: int
) -> None:
    rng = np.random.default_rng(heads * 1000 + k + n)
    tokens = 40
    wide = backend.from_numpy(rng.standard_normal((tokens, heads, k + 8), dtype=np.float32))
    x = wide[:, :, 8:]  # a strided view, as the layer passes q_nope
    weight = backend.from_numpy(rng.standard_normal((heads, n, k), dtype=np.float32) * k**-0.5, weight=True)
    full = host(backend, mla.mla_head_linear(x, weight))
    want = np.einsum("thk,hnk->thn", host(backend, x), host(backend, weight))
    assert np.abs(full - want).max() <= 2e-2 * np.abs(want).max()
    for rows in ([0], [3, 4, 5], list(range(16)), list(range(17)), [39, 0, 39]):
        part = host(backend, mla.mla_head_linear(x[rows], weight))
        np.testing.assert_array_equal(part, full[rows], err_msg=f"rows {rows} computed apart differ from T={tokens}")
    out = backend.zeros((tokens, heads, n), np.dtype(backend.activation_dtype))
    assert mla.mla_head_linear(x, weight, out=out) is out
    np.testing.assert_array_equal(host(backend, out), full)


# ---- the latent write ------------------------------------------------------------------------------
def test_write_latent_with_odd_widths_and_skipped_slots(backend: CudaBackend, mla: MLAOps) -> None:
    rng = np.random.default_rng(5)
    latent_width, rope, tokens, blocks, block_size = 37, 5, 50, 9, 7
    cache = backend.from_numpy(rng.standard_normal((blocks, block_size, 1, latent_width + rope), dtype=np.float32))
    before = host(backend, cache)
    projection = backend.from_numpy(rng.standard_normal((tokens, 2 + latent_width + rope), dtype=np.float32))
    slots = rng.permutation(blocks * block_size)[:tokens].astype(np.int32)
    slots[::3] = -1
    mla.mla_write_latent(
        cache, projection[:, 2 : 2 + latent_width], projection[:, 2 + latent_width :], backend.from_numpy(slots)
    )
    want = before.reshape(-1, latent_width + rope).copy()
    keep = slots >= 0
    want[slots[keep]] = host(backend, projection)[keep, 2:]
    np.testing.assert_array_equal(host(backend, cache).reshape(-1, latent_width + rope), want)


# ---- attention ---------------------------------------------------------------------------------------
SHAPES = {
    "tiny": (4, 32, 8),
    "unaligned-width": (20, 40, 3),
    "odd-heads": (17, 72, 8),
    "deepseek-v3": (128, 512, 64),
}
"""(heads, latent width L, rotary width R): H not a multiple of the 16-row blocks, L + R not a multiple of 8
or 16, and DeepSeek-V3's widths (16 latent n-tiles per warp, 576-wide cache rows)."""
LENGTHS = [(255, 1), (256, 1), (257, 1), (0, 70), (511, 9), (1030, 1), (3, 1)]
"""(cached, new) tokens: decodes just below, on and above a 256-key split boundary and past several,
a prefill, a chunk that crosses a split, and a short decode."""


@pytest.mark.parametrize("row_scaled", [False, True], ids=["plain", "row-scale"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_attention_matches_the_reference_in_split_and_direct_mode(
    backend: CudaBackend,
    mla: MLAOps,
    shape: tuple[int, int, int],
    row_scaled: bool,
) -> None:
    heads, latent, rope = shape
    rng = np.random.default_rng(heads + latent + rope)
    meta, host_meta, cache, tokens = latent_batch(backend, rng, LENGTHS, latent + rope, block_size=16)
    q_latent, q_rope = queries(backend, rng, tokens, heads, latent, rope)
    row_scale = (
        backend.from_numpy(rng.uniform(1.0, 1.4, tokens).astype(np.float32), dtype=np.float32) if row_scaled else None
    )
    scale = (128 + rope) ** -0.5
    direct = attend(backend, mla, "never", q_latent, q_rope, cache, meta, scale, row_scale)
    split = attend(backend, mla, "always", q_latent, q_rope, cache, meta, scale, row_scale)
    want = latent_attention_reference(
        host(backend, q_latent),
        host(backend, q_rope),
        host(backend, cache),
        host_meta,
        scale,
        None if row_scale is None else host(backend, row_scale),
    )
    assert np.isfinite(direct).all()
    assert np.abs(direct - want).max() <= 2e-2 * np.abs(want).max()
    np.testing.assert_array_equal(split, direct, err_msg="split-K and direct mode must give the same bits")


def test_attention_rows_do_not_depend_on_the_batch(backend: CudaBackend, mla: MLAOps) -> None:
    """A decode token attends the same alone, beside a prefill chunk and other decodes, and under a
    captured graph's static plan (16 splits of attention, padded with an empty sequence)."""
    heads, latent, rope = 20, 64, 16
    rng = np.random.default_rng(11)
    meta, _, cache, tokens = latent_batch(backend, rng, [(40, 25), (900, 1), (3, 1)], latent + rope, block_size=16)
    q_latent, q_rope = queries(backend, rng, tokens, heads, latent, rope)
    together = host(backend, mla.mla_attention(q_latent, q_rope, cache, meta, 0.1))
    cp = backend.cp
    tables, lens = meta.block_tables[1:2], meta.seq_lens[1:2]
    for rows in ([25], [25, 0]):  # alone, and as a graph's bucket of 2 padded with an empty sequence
        alone_meta = AttentionMetadata(
            cp.arange(len(rows) + 1, dtype=np.int32),
            cp.concatenate([lens, cp.zeros(1, dtype=np.int32)])[: len(rows)],
            cp.concatenate([tables, cp.zeros_like(tables)])[: len(rows)],
            meta.slot_mapping[: len(rows)],
        )
        q = (q_latent[rows], q_rope[rows])
        alone = host(backend, mla.mla_attention(*q, cache, alone_meta, 0.1))
        np.testing.assert_array_equal(alone[0], together[25])
        runner = backend.attention_runner
        runner.static = runner.static_work(len(rows), 16)
        try:
            static = host(backend, mla.mla_attention(*q, cache, alone_meta, 0.1))
        finally:
            runner.static = None
        np.testing.assert_array_equal(static[0], together[25], err_msg="the static (graph) plan changes the bits")


def test_captured_attention_replays_the_eager_result(backend: CudaBackend, mla: MLAOps) -> None:
    """The op under stream capture with a static plan: no host synchronisation, no read-back, the same bits."""
    cp = backend.cp
    heads, latent, rope = 16, 128, 32
    rng = np.random.default_rng(12)
    meta, _, cache, tokens = latent_batch(backend, rng, [(300, 1), (5, 1), (1200, 1)], latent + rope, block_size=16)
    q_latent, q_rope = queries(backend, rng, tokens, heads, latent, rope)
    eager = host(backend, mla.mla_attention(q_latent, q_rope, cache, meta, 0.2))
    runner, stream, pool = backend.attention_runner, cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    try:
        with cp.cuda.using_allocator(pool.malloc), stream:
            runner.static = runner.static_work(tokens, 32)
            mla.mla_attention(q_latent, q_rope, cache, meta, 0.2)  # warm-up: derived plan, pool blocks
            stream.synchronize()
            stream.begin_capture()
            try:
                out = mla.mla_attention(q_latent, q_rope, cache, meta, 0.2)
            finally:
                graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
    finally:
        runner.static = None
    np.testing.assert_array_equal(host(backend, out), eager)
