"""FP8 E4M3 (W8A16), NVFP4 (W4A16) and GGUF block weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)
executed as they are on the cuda backend: products over the
quantized bytes are at least as close to the exact products of the dequantized weight (float64) as the
products over its bf16 rounding are (dense and grouped expert GEMMs, vector and scalar kernels; FP8
block-scaled, per-channel and per-tensor scales, edge blocks; NVFP4 rows of different global scales), the
weights stay one byte (FP8) or 0.5625 bytes (NVFP4) each on the device, FP8 scale blocks the kernels do not take
are dequantized at load, and every FP8 and NVFP4 tiny checkpoint gives the logits of its dequantized copy.
Needs a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend
from atlas_gb10.gemm_shapes import low8_loads
from atlas_gb10.quantized_weights import GGUF_Q8_0, ROW_FORMATS
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from atlas_core import LLM
from atlas_core.backends.ops.moe import MoEOps
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.nvfp4 import dequantized_nvfp4_copy
from atlas_core.testing.quantized import dequantized_copy, prompt_logits, quantized_weights, sample_prompts
from atlas_core.weights.gguf_quantized import quantize as gguf_quantize
from atlas_core.weights.gguf_quantized import random_gguf_weight
from atlas_core.weights.nvfp4 import NVFP4, nvfp4_from_float
from atlas_core.weights.quantized import QuantizedWeight, dequantize, quantize_fp8

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

FIXTURES = Path(__file__).parents[3] / "plugins" / "models"
FP8_CHECKPOINTS = TinyCheckpoints(*sorted(FIXTURES.glob("*/tests/fixtures/fp8")))
NVFP4_CHECKPOINTS = TinyCheckpoints(*sorted(FIXTURES.glob("*/tests/fixtures/nvfp4")))
LLMCOMPRESSOR = TinyCheckpoints(Path(__file__).parents[3] / "tests" / "fixtures" / "llmcompressor")
"""Tiny Qwen3s quantized by llm-compressor itself: FP8 blocks, FP8 per channel, NVFP4A16."""
CHECKPOINTS = [
    *((FP8_CHECKPOINTS, name, "fp8") for name in FP8_CHECKPOINTS.names),
    *((NVFP4_CHECKPOINTS, name, NVFP4) for name in NVFP4_CHECKPOINTS.names),
    *((LLMCOMPRESSOR, name, NVFP4 if "nvfp4" in name else "fp8") for name in LLMCOMPRESSOR.names),
]
LINEAR_CASES = {  # (N, K, block): the vector kernels need K % 8 == 0
    "128x128 blocks": (384, 512, (128, 128)),
    "edge blocks": (200, 296, (128, 128)),
    "per channel": (96, 256, (1, 256)),
    "per tensor": (64, 128, (64, 128)),
    "64-wide blocks": (72, 160, (16, 64)),
    "scalar kernel, odd K": (40, 100, (1, 100)),
}
DEQUANTIZED_AT_LOAD = {"16x32 blocks": (48, 64, (16, 32)), "8x4 blocks": (40, 100, (8, 4))}
Q8_0_CASES = {"aligned rows": (384, 512), "three blocks a row": (200, 96)}  # (N, K)
GGUF_BLOCK_CASES = {  # format: (N, K) cases; K-quant rows hold 256-element super-blocks
    **{qtype: [(384, 512), (200, 96)] for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)},
    **{qtype: [(256, 512), (40, 256)] for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K)},
}
GGUF_FIXTURES = ["llama_q8_0", "llama_q4_0", "qwen2_q4_1", "qwen2_q5_0", "qwen3_q5_1", "llama_k_mix", "qwen3moe_q8_0"]
NVFP4_CASES = {  # (N, K, row groups of their own global scale): rows of K % 64 != 0 take the scalar kernels
    "aligned rows": (384, 512, 1),
    "fused rows, two global scales": (256, 2048, 2),
    "scalar kernel, K = 80": (40, 80, 1),
}


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def native_and_bf16(backend: CudaBackend, weight: QuantizedWeight) -> tuple[QuantizedWeight, object]:
    """The weight uploaded as it is, and its dequantization rounded to bf16 (the path without quantized kernels)."""
    native = backend.upload_quantized(weight)
    assert isinstance(native, QuantizedWeight) and native.data.dtype == np.uint8
    return native, backend.from_numpy(dequantize(weight), weight=True)


def nvfp4(rng: np.random.Generator, shape: tuple[int, ...], parts: int = 1) -> QuantizedWeight:
    """An NVFP4 weight quantized as checkpoints are, its rows in ``parts`` groups, each with a global scale of its
    own (a fused projection's parts): compressed-tensors' divided scale for the first, ModelOpt's product after."""
    values = rng.standard_normal(shape, dtype=np.float32) * 0.05
    quantized = [nvfp4_from_float(part, i == 0) for i, part in enumerate(np.array_split(values, parts, axis=-2))]
    return QuantizedWeight(
        NVFP4, np.concatenate([q.data for q in quantized], axis=-2), None, quantized[0].block, values.shape
    )


def assert_product_of_the_dequantized_weight(
    backend: CudaBackend, weight: QuantizedWeight, rows: int, bytes_per_element: float, what: str
) -> None:
    """``linear`` over the weight as it is: within the error of the bf16-rounded weight's product (or 2^-8 of the
    largest output), its rows independent of the batch, the weight about ``bytes_per_element`` on the device."""
    n, k = weight.shape
    rng = np.random.default_rng(n * k + rows)
    native, bf16 = native_and_bf16(backend, weight)
    x = backend.from_numpy(rng.standard_normal((rows, k), dtype=np.float32))
    exact = backend.to_numpy(x).astype(np.float64) @ dequantize(weight).astype(np.float64).T
    got = backend.to_numpy(backend.linear(x, native)).astype(np.float64)
    via_bf16 = backend.to_numpy(backend.linear(x, bf16)).astype(np.float64)
    scale = np.abs(exact).max()
    assert max_error(got, exact) <= max(max_error(via_bf16, exact), 2**-8 * scale), what
    assert max_error(got, exact) <= 2**-7 * scale, what
    assert native.nbytes < bytes_per_element * n * k, f"{what}: {native.nbytes} bytes on the device"
    again = backend.to_numpy(backend.linear(x[:1], native)).astype(np.float64)
    np.testing.assert_array_equal(again, got[:1], err_msg="a row's product must not depend on the batch")


def max_error(got: np.ndarray, exact: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - exact).max())


@pytest.mark.parametrize("rows", [1, 5, 12, 40])
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_linear_over_fp8_is_the_product_of_the_dequantized_weight(backend: CudaBackend, case: str, rows: int) -> None:
    n, k, block = LINEAR_CASES[case]
    weight = quantize_fp8(np.random.default_rng(n + k).standard_normal((n, k), dtype=np.float32) * 0.05, block)
    assert_product_of_the_dequantized_weight(backend, weight, rows, 1.2, case)


@pytest.mark.parametrize("rows", [1, 5, 12, 40])
@pytest.mark.parametrize("case", list(NVFP4_CASES))
def test_linear_over_nvfp4_is_the_product_of_the_dequantized_weight(backend: CudaBackend, case: str, rows: int) -> None:
    n, k, parts = NVFP4_CASES[case]
    weight = nvfp4(np.random.default_rng(n + k), (n, k), parts)
    assert backend.keeps_quantized(weight) and weight.format == NVFP4
    assert_product_of_the_dequantized_weight(backend, weight, rows, 0.5625 + (8 + 15) / k + 0.01, case)


def wide_weight(fmt: str, n: int, k: int, seed: int) -> tuple[QuantizedWeight, float]:
    """A random ``[n, k]`` weight in ``fmt`` (``fp8``, NVFP4 or a GGUF format) and its bytes per element bound."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    if fmt == NVFP4:
        return nvfp4_from_float(values), 0.5625 + (8 + 15) / k + 0.01
    if fmt == "fp8":
        return quantize_fp8(values, (128, 128)), 1.2
    qtype = Q[fmt.removeprefix("gguf_").upper()]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return random_gguf_weight(rng, qtype, (n, k)), type_size / block_size + 15 / k + 0.01


@pytest.mark.parametrize("rows", [1, 5, 12])
@pytest.mark.parametrize("fmt", ["fp8", NVFP4, GGUF_Q8_0])
def test_three_block_decode_kernels(backend: CudaBackend, fmt: str, rows: int) -> None:
    """Products whose decode blocks fill 2-3 an SM take the ``vec8x3`` kernels: the same products and bits."""
    n, k = 16 * (5 * backend.profile.sm_count // 2), 512
    assert low8_loads(fmt, n, backend.gemm_tile(1, n, k, fmt)[1], backend.profile.sm_count) == "vec8x3"
    weight, size = wide_weight(fmt, n, k, rows)
    assert_product_of_the_dequantized_weight(backend, weight, rows, size, f"{fmt}, N = {n}")


@pytest.mark.parametrize("rows", [1, 5, 12])
@pytest.mark.parametrize("fmt", ["fp8", NVFP4, GGUF_Q8_0, "gguf_q4_0", "gguf_q5_1", "gguf_q4_k", "gguf_q6_k"])
def test_two_tile_decode_kernels(backend: CudaBackend, fmt: str, rows: int) -> None:
    """Decode products of two n-tiles a block (swapped fragments) with a last block half outside the matrix, for
    every format: the same products, and bits that do not depend on the batch."""
    n, k = 16 * 4 * backend.profile.sm_count + 8, 512
    assert backend.gemm_tile(1, n, k, fmt) == (1, 2)
    weight, size = wide_weight(fmt, n, k, rows)
    assert_product_of_the_dequantized_weight(backend, weight, rows, size, f"{fmt}, N = {n}")


@pytest.mark.parametrize("case", list(DEQUANTIZED_AT_LOAD))
def test_fp8_blocks_the_kernels_do_not_take_are_dequantized_at_load(backend: CudaBackend, case: str) -> None:
    n, k, block = DEQUANTIZED_AT_LOAD[case]
    weight = quantize_fp8(np.random.default_rng(0).standard_normal((n, k), dtype=np.float32), block)
    uploaded = backend.upload_quantized(weight)
    assert not isinstance(uploaded, QuantizedWeight)
    np.testing.assert_array_equal(backend.to_numpy(uploaded), backend.to_numpy(backend.from_numpy(dequantize(weight))))


@pytest.mark.parametrize("rows", [1, 5, 12, 40])
@pytest.mark.parametrize("case", list(Q8_0_CASES))
def test_linear_over_gguf_q8_0_is_the_product_of_the_dequantized_weight(
    backend: CudaBackend, case: str, rows: int
) -> None:
    n, k = Q8_0_CASES[case]
    weight = gguf_quantize(np.random.default_rng(n + k).standard_normal((n, k), dtype=np.float32) * 0.05, Q.Q8_0)
    assert backend.keeps_quantized(weight) and weight.format == GGUF_Q8_0
    assert_product_of_the_dequantized_weight(backend, weight, rows, 34 / 32 + 15 / k + 0.01, case)


@pytest.mark.parametrize("rows", [1, 5, 12, 40])
@pytest.mark.parametrize(
    ("qtype", "shape"), [(q, shape) for q, shapes in GGUF_BLOCK_CASES.items() for shape in shapes], ids=str
)
def test_linear_over_gguf_blocks_is_the_product_of_the_dequantized_weight(
    backend: CudaBackend, qtype: Q, shape: tuple[int, int], rows: int
) -> None:
    weight = random_gguf_weight(np.random.default_rng(sum(shape)), qtype, shape)
    assert backend.keeps_quantized(weight) and weight.format in ROW_FORMATS
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    assert_product_of_the_dequantized_weight(
        backend, weight, rows, type_size / block_size + 15 / shape[1] + 0.01, qtype.name
    )


@pytest.mark.parametrize("tokens", [1, 6, 300, 600])
@pytest.mark.parametrize("fmt", ["fp8", NVFP4, GGUF_Q8_0, "gguf_q4_0", "gguf_q5_1", "gguf_q4_k", "gguf_q6_k"])
def test_expert_products_over_quantized_banks(backend: CudaBackend, tokens: int, fmt: str) -> None:
    """Against the same experts over the bf16-rounded banks (which differ by that rounding only), and
    a token's rows alone against the same rows in the batch."""
    experts, top_k, hidden, width = 16, 4, 256, 96 if fmt in ("fp8", NVFP4, GGUF_Q8_0) else 256
    rng = np.random.default_rng(tokens)
    if fmt == NVFP4:  # the down bank's rows (K = 96) take the scalar kernels
        w_in, w_out = nvfp4(rng, (experts, 2 * width, hidden)), nvfp4(rng, (experts, hidden, width))
    elif fmt.startswith("gguf_"):
        qtype = Q[fmt.removeprefix("gguf_").upper()]
        w_in, w_out = (
            random_gguf_weight(rng, qtype, (experts, 2 * width, hidden)),
            random_gguf_weight(rng, qtype, (experts, hidden, width)),
        )
    else:
        w_in = quantize_fp8(rng.standard_normal((experts, 2 * width, hidden), dtype=np.float32) * 0.05, (32, 128))
        w_out = quantize_fp8(rng.standard_normal((experts, hidden, width), dtype=np.float32) * 0.05, (128, 64))
    (in_fp8, in_bf16), (out_fp8, out_bf16) = native_and_bf16(backend, w_in), native_and_bf16(backend, w_out)
    x = backend.from_numpy(rng.standard_normal((tokens, hidden), dtype=np.float32))
    ids = backend.from_numpy(np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)]))
    weights = backend.from_numpy(rng.random((tokens, top_k), dtype=np.float32), dtype=np.dtype(np.float32))
    moe = backend.ops(MoEOps)
    got = backend.to_numpy(moe.moe_experts(x, in_fp8, out_fp8, weights, ids, "silu")).astype(np.float64)
    want = backend.to_numpy(moe.moe_experts(x, in_bf16, out_bf16, weights, ids, "silu")).astype(np.float64)
    assert np.abs(got - want).max() <= 2**-5 * np.abs(want).max()
    alone = moe.moe_experts(x[:1], in_fp8, out_fp8, weights[:1], ids[:1], "silu")
    np.testing.assert_array_equal(backend.to_numpy(alone).astype(np.float64), got[:1])


def cuda_llm(folder: Path, **settings: object) -> LLM:
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    share = min(1.0, (total - free + 2**30) / total)
    return LLM(folder, backend="cuda", gpu_memory_utilization=share, **settings)  # type: ignore[arg-type]


def assert_logits_close(quantized: LLM, reference: LLM, vocab_size: int, what: str) -> None:
    """Within bf16 rounding of the weights (the reference holds them rounded to bf16, the quantized model exact),
    which moves a tiny random model's log-probabilities as bf16 does (median position within 0.1, a MoE router's
    near tie up to a few: see test_cuda_models)."""
    drifts = []
    for prompt in sample_prompts(vocab_size):
        got, want = log_softmax(prompt_logits(quantized, prompt)), log_softmax(prompt_logits(reference, prompt))
        drifts += [np.abs(g - w)[w > np.log(1e-3)].max() for g, w in zip(got, want, strict=True)]
    assert np.median(drifts) < 0.1 and max(drifts) < 3.0, f"{what}: per-position drifts {np.round(drifts, 2)}"


@pytest.mark.parametrize(("checkpoints", "name", "fmt"), CHECKPOINTS, ids=[f"{f}-{n}" for _, n, f in CHECKPOINTS])
def test_quantized_checkpoints_give_the_logits_of_their_dequantized_copies(
    checkpoints: TinyCheckpoints, name: str, fmt: str, tmp_path: Path
) -> None:
    folder = checkpoints / name
    quantized = cuda_llm(folder)
    held = quantized_weights(quantized.loaded.model)
    assert all(w.data.dtype == np.uint8 for w in held)
    block = (checkpoints.config(name).get("quantization_config") or {}).get("weight_block_size") or [1, 1 << 30]
    if block[1] % 32 == 0:
        assert held, f"{name}: its quantized weights must stay quantized on the GPU"
    copy = dequantized_nvfp4_copy if fmt == NVFP4 else dequantized_copy
    reference = cuda_llm(copy(folder, tmp_path / name))
    assert_logits_close(quantized, reference, int(checkpoints.config(name)["vocab_size"]), name)


@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_gguf_models_run_their_blocks_as_stored(name: str) -> None:
    """Each block-quantized GGUF fixture kept in its blocks (``gguf_weights="quantized"``) against the same file
    dequantized at load: its linear weights stay in their blocks on the GPU and give the float copy's logits."""
    path = Path(__file__).parents[3] / "tests" / "fixtures" / "gguf" / f"{name}.gguf"
    quantized, reference = cuda_llm(path, gguf_weights="quantized"), cuda_llm(path, gguf_weights="float")
    held = quantized_weights(quantized.loaded.model)
    assert held and all(w.format in ROW_FORMATS and w.data.dtype == np.uint8 for w in held)
    assert_logits_close(quantized, reference, quantized.loaded.model.vocab_size, name)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
