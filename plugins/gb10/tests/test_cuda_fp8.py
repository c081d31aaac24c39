"""FP8 E4M3 weights executed as they are on the cuda backend: products over the FP8 bytes equal the
products over their bf16 dequantization bit for bit (dense and grouped expert GEMMs, vector and
scalar kernels, block-scaled, per-channel and per-tensor scales, edge blocks), the weights stay one
byte each on the device, and every FP8 tiny checkpoint gives the logits of its dequantized copy.
Needs a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core import LLM
from atlas_core.backends.ops.moe import MoEOps
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.quantized import dequantized_copy, prompt_logits, quantized_weights, sample_prompts
from atlas_core.weights.quantized import QuantizedWeight, dequantize, quantize_fp8

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

FP8_CHECKPOINTS = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/fp8")))
LINEAR_CASES = {  # (N, K, block): vector kernels need K % 8 == 0 and a block of 8k columns (or all of K)
    "128x128 blocks": (384, 512, (128, 128)),
    "edge blocks": (200, 296, (128, 128)),
    "per channel": (96, 256, (1, 256)),
    "per tensor": (64, 128, (64, 128)),
    "small blocks": (48, 64, (16, 16)),
    "scalar kernel, odd K": (40, 100, (8, 4)),
}


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def fp8_and_bf16(backend: CudaBackend, weight: QuantizedWeight) -> tuple[QuantizedWeight, object]:
    """The weight uploaded as FP8, and its dequantization uploaded as bf16 (the oracle)."""
    native = backend.upload_quantized(weight)
    assert isinstance(native, QuantizedWeight) and native.data.dtype == np.uint8
    return native, backend.from_numpy(dequantize(weight), weight=True)


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_linear_over_fp8_equals_linear_over_its_bf16_dequantization(backend: CudaBackend, case: str, rows: int) -> None:
    n, k, block = LINEAR_CASES[case]
    rng = np.random.default_rng(n * k + rows)
    weight = quantize_fp8(rng.standard_normal((n, k), dtype=np.float32) * 0.05, block)
    native, bf16 = fp8_and_bf16(backend, weight)
    x = backend.from_numpy(rng.standard_normal((rows, k), dtype=np.float32))
    got, want = backend.to_numpy(backend.linear(x, native)), backend.to_numpy(backend.linear(x, bf16))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=case)
    assert native.nbytes < 0.6 * n * k * 2, "an FP8 weight must take about a byte per element on the device"


@pytest.mark.parametrize("tokens", [1, 6, 300, 600])
def test_expert_products_over_fp8_banks_equal_those_over_bf16(backend: CudaBackend, tokens: int) -> None:
    experts, top_k, hidden, width = 16, 4, 256, 96
    rng = np.random.default_rng(tokens)
    w_in = quantize_fp8(rng.standard_normal((experts, 2 * width, hidden), dtype=np.float32) * 0.05, (32, 128))
    w_out = quantize_fp8(rng.standard_normal((experts, hidden, width), dtype=np.float32) * 0.05, (128, 32))
    (in_fp8, in_bf16), (out_fp8, out_bf16) = fp8_and_bf16(backend, w_in), fp8_and_bf16(backend, w_out)
    x = backend.from_numpy(rng.standard_normal((tokens, hidden), dtype=np.float32))
    ids = backend.from_numpy(np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)]))
    weights = backend.from_numpy(rng.random((tokens, top_k), dtype=np.float32), dtype=np.dtype(np.float32))
    moe = backend.ops(MoEOps)
    got = backend.to_numpy(moe.moe_experts(x, in_fp8, out_fp8, weights, ids, "silu"))
    want = backend.to_numpy(moe.moe_experts(x, in_bf16, out_bf16, weights, ids, "silu"))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def cuda_llm(folder: Path) -> LLM:
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    return LLM(folder, backend="cuda", gpu_memory_utilization=min(1.0, (total - free + 2**30) / total))


@pytest.mark.parametrize("name", FP8_CHECKPOINTS.names)
def test_fp8_checkpoints_give_the_logits_of_their_dequantized_copies(name: str, tmp_path: Path) -> None:
    folder = FP8_CHECKPOINTS / name
    quantized = cuda_llm(folder)
    held = quantized_weights(quantized.loaded.model)
    assert held and all(w.data.dtype == np.uint8 for w in held), f"{name}: FP8 weights must stay FP8 on the GPU"
    reference = cuda_llm(dequantized_copy(folder, tmp_path / name))
    for prompt in sample_prompts(int(FP8_CHECKPOINTS.config(name)["vocab_size"])):
        got, want = prompt_logits(quantized, prompt), prompt_logits(reference, prompt)
        np.testing.assert_array_equal(got, want, err_msg=f"{name}, {prompt}")
