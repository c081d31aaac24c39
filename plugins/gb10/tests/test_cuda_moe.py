"""The cuda backend's ``moe`` op group beyond the shared conformance suite: routing at the real models'
sizes (ties, groups, 512 experts), the grouped expert products on batches that leave experts empty,
send every token to one expert, or have expert counts that do not divide the tiles (decode-sized
batches, a block per pair, and grouped ones alike), and rows that are bit-identical whatever the batch
(with or without the grouping plan, whatever its tiles). Needs a CUDA GPU."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core.backends.ops.moe import MoEOps, RouterSpec, moe_experts_reference, moe_route_reference

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

F32 = np.dtype(np.float32)


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


@pytest.fixture(scope="module")
def moe(backend: CudaBackend) -> MoEOps:
    ops = backend.ops(MoEOps)
    assert type(ops).__name__ == "CudaMoEOps", "the cuda backend must resolve its native moe implementation"
    return ops


def host(backend: CudaBackend, x: object) -> np.ndarray:
    return np.asarray(backend.to_numpy(x)).astype(np.float32)


# ---- routing ---------------------------------------------------------------------------------------
ROUTERS = {
    "qwen3-30b-a3b": RouterSpec(128, 8, normalize_top_k=True),
    "qwen3-next": RouterSpec(512, 10, normalize_top_k=True),
    "deepseek-v3": RouterSpec(
        256, 8, scoring="sigmoid", normalize_top_k=True, num_groups=8, top_k_groups=4, routed_scaling_factor=2.5
    ),
    "minimax-m2": RouterSpec(256, 8, scoring="sigmoid", normalize_top_k=True),
    "odd-groups": RouterSpec(60, 6, num_groups=5, top_k_groups=3, routed_scaling_factor=1.5),
}


@pytest.mark.parametrize("tokens", [1, 5, 300])
@pytest.mark.parametrize("name", list(ROUTERS))
def test_routing_matches_the_reference(backend: CudaBackend, moe: MoEOps, name: str, tokens: int) -> None:
    spec = ROUTERS[name]
    rng = np.random.default_rng(tokens * 1000 + spec.num_experts)
    logits = backend.from_numpy(rng.standard_normal((tokens, spec.num_experts), dtype=np.float32) * 2)
    bias = None
    if spec.scoring == "sigmoid":
        bias = backend.from_numpy(rng.standard_normal(spec.num_experts, dtype=np.float32) * 0.1, dtype=F32)
    weights, ids = moe.moe_route(logits, spec, bias)
    want_w, want_ids = moe_route_reference(
        host(backend, logits), None if bias is None else host(backend, bias), spec=spec
    )
    got_ids = backend.to_numpy(ids)
    # a float32 near-tie may be broken either way: count disagreements and accept only those
    mismatched = np.flatnonzero((got_ids != want_ids).any(axis=1))
    assert len(mismatched) <= max(1, tokens // 100), f"{name}: {len(mismatched)} of {tokens} tokens routed differently"
    keep = np.setdiff1d(np.arange(tokens), mismatched)
    np.testing.assert_allclose(host(backend, weights)[keep], want_w[keep], rtol=1e-5, atol=1e-6)


def test_routing_ties_go_to_the_lower_expert(backend: CudaBackend, moe: MoEOps) -> None:
    logits = np.zeros((3, 16), dtype=np.float32)
    logits[1, [5, 9, 12]] = 1.0
    logits[2, ::2] = 2.0
    weights, ids = moe.moe_route(backend.from_numpy(logits), RouterSpec(16, 4, normalize_top_k=True))
    np.testing.assert_array_equal(backend.to_numpy(ids), [[0, 1, 2, 3], [5, 9, 12, 0], [0, 2, 4, 6]])
    np.testing.assert_allclose(host(backend, weights)[0], 0.25, rtol=1e-6)


def test_routing_past_the_kernel_limits_still_runs(backend: CudaBackend, moe: MoEOps) -> None:
    """More experts than the kernel takes: the host reference answers, on the device."""
    spec = RouterSpec(1100, 2)
    logits = np.random.default_rng(0).standard_normal((2, 1100), dtype=np.float32)
    weights, ids = moe.moe_route(backend.from_numpy(logits), spec)
    want = moe_route_reference(host(backend, backend.from_numpy(logits)), None, spec=spec)[1]
    np.testing.assert_array_equal(backend.to_numpy(ids), want)


# ---- experts ---------------------------------------------------------------------------------------
def expert_case(
    backend: CudaBackend, rng: np.random.Generator, experts: int, hidden: int, inter: int, activation: str
) -> tuple:
    gated = activation != "relu2"
    w_in = backend.from_numpy(
        rng.standard_normal((experts, (2 if gated else 1) * inter, hidden), dtype=np.float32) * hidden**-0.5,
        weight=True,
    )
    w_out = backend.from_numpy(
        rng.standard_normal((experts, hidden, inter), dtype=np.float32) * inter**-0.5, weight=True
    )
    return w_in, w_out


def run_experts(
    backend: CudaBackend, moe: MoEOps, x: np.ndarray, ids: np.ndarray, w_in: object, w_out: object, activation: str
) -> tuple[np.ndarray, np.ndarray]:
    """(cuda result, float32 reference on the same bf16 inputs)."""
    rng = np.random.default_rng(ids.size)
    weights = rng.uniform(0.1, 1.0, ids.shape).astype(np.float32)
    x_dev = backend.from_numpy(x)
    got = moe.moe_experts(
        x_dev, w_in, w_out, backend.from_numpy(weights, dtype=F32), backend.from_numpy(ids.astype(np.int32)), activation
    )
    want = moe_experts_reference(
        host(backend, x_dev), host(backend, w_in), host(backend, w_out), weights, ids, activation=activation
    )
    return host(backend, got), want


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu2"])
@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "hidden", "inter"),
    [
        (1, 128, 8, 256, 96),
        (7, 7, 3, 72, 40),
        (300, 16, 4, 128, 64),
        (900, 64, 8, 256, 136),
        (33, 5, 2, 61, 23),
        (3, 5, 2, 61, 23),
    ],
    ids=["decode-128", "odd-experts", "prefill", "prefill-tiled", "unaligned", "unaligned-decode"],
)
def test_experts_match_the_reference(
    backend: CudaBackend, moe: MoEOps, activation: str, tokens: int, experts: int, top_k: int, hidden: int, inter: int
) -> None:
    rng = np.random.default_rng(tokens + experts)
    w_in, w_out = expert_case(backend, rng, experts, hidden, inter, activation)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    ids = np.stack([rng.choice(experts, size=top_k, replace=False) for _ in range(tokens)])
    got, want = run_experts(backend, moe, x, ids, w_in, w_out, activation)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * np.abs(want).max())


@pytest.mark.parametrize("tokens", [1, 40, 600, 3000])
def test_every_token_on_one_expert_and_idle_experts(backend: CudaBackend, moe: MoEOps, tokens: int) -> None:
    rng = np.random.default_rng(tokens)
    w_in, w_out = expert_case(backend, rng, 32, 64, 48, "silu")
    x = rng.standard_normal((tokens, 64), dtype=np.float32)
    ids = np.full((tokens, 2), 3)
    ids[:, 1] = 30  # experts 3 and 30 take everything, 30 others stay empty
    got, want = run_experts(backend, moe, x, ids, w_in, w_out, "silu")
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * np.abs(want).max())


def test_expert_rows_do_not_depend_on_the_batch(backend: CudaBackend, moe: MoEOps) -> None:
    """In the batch-invariant mode a token's output is bit-identical alone, in a decode-sized batch and in a
    prefill-sized batch (whose plan takes larger tiles), wherever it sits; outside it, the tiled products of
    prefill-sized batches (`moe_gemm_tiled`) also give a token the same bits in any such batch."""
    rng = np.random.default_rng(7)
    experts, top_k, hidden = 64, 6, 256
    w_in, w_out = expert_case(backend, rng, experts, hidden, 128, "silu")
    x = backend.from_numpy(rng.standard_normal((3000, hidden), dtype=np.float32))
    ids = backend.from_numpy(
        np.stack([rng.choice(experts, size=top_k, replace=False) for _ in range(3000)]).astype(np.int32)
    )
    weights = backend.from_numpy(rng.uniform(0.1, 1.0, (3000, top_k)), dtype=F32)
    tiled = backend.to_numpy(moe.moe_experts(x, w_in, w_out, weights, ids, "silu"))
    shifted = moe.moe_experts(x[500:], w_in, w_out, weights[500:], ids[500:], "silu")
    np.testing.assert_array_equal(backend.to_numpy(shifted), tiled[500:], err_msg="tiled rows moved by 500")
    backend.batch_invariant = True
    try:
        full = backend.to_numpy(moe.moe_experts(x, w_in, w_out, weights, ids, "silu"))
        assert not np.array_equal(full, tiled), "the prefill-sized batch did not take the tiled products"
        for rows in ([5], [5, 17, 2999], list(range(100, 130)), [2999, 5, 5]):
            part = moe.moe_experts(x[rows], w_in, w_out, weights[rows], ids[rows], "silu")
            np.testing.assert_array_equal(backend.to_numpy(part), full[rows], err_msg=f"rows {rows[:4]}...")
    finally:
        backend.batch_invariant = False
