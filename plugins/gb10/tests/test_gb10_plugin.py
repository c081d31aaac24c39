"""atlas-gb10 without a GPU: registration, availability reasons, the kernel registry, and the
compile-only check of every kernel for Hopper (sm_90a) and GB10 (sm_121) where nvcc is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from atlas_gb10.hardware import GB10, HOPPER, PROFILES
from atlas_gb10.registry import KERNEL_DIR, KernelNotFoundError, all_variants, lookup

from atlas_core.plugins import load_plugins

SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_registers_cuda_backend_with_priority_over_numpy() -> None:
    registration = load_plugins().get("backend", "cuda")
    assert registration.plugin.distribution == "atlas-gb10"
    assert registration.target == "atlas_gb10.backend:CudaBackend"
    assert int(registration.metadata["priority"]) > 0


def test_availability_is_none_or_a_reason() -> None:
    backend_class = load_plugins().get("backend", "cuda").load()
    reason = backend_class.availability()
    assert reason is None or (isinstance(reason, str) and reason)


def test_atlas_plugins_check_lists_cuda_with_its_status() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "atlas_core.cli", "plugins", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "atlas-gb10" in result.stdout and "cuda" in result.stdout
    from atlas_gb10.backend import CudaBackend

    reason = CudaBackend.availability()
    if reason is not None:
        assert "unavailable" in result.stdout


def test_profiles_describe_gb10_and_hopper() -> None:
    assert PROFILES[(12, 1)] is GB10 and GB10.arch == "sm_121" and GB10.cpu == "aarch64"
    assert "no wgmma" in GB10.matrix_instructions
    assert PROFILES[(9, 0)] is HOPPER and HOPPER.arch == "sm_90a"
    for profile in (GB10, HOPPER):
        assert profile.sm_count > 0 and profile.memory_bandwidth_gbs > 0 and profile.shared_memory_per_block > 0


def test_registry_falls_back_to_generic_and_names_what_exists() -> None:
    assert lookup("gb10", "attention", "bf16").define("ATT_TILE_N", 0) == 32
    assert lookup("hopper", "attention", "bf16") == lookup("generic", "attention", "bf16")
    assert lookup("some-future-gpu", "gemm", "bf16").source == "gemm.cu"
    with pytest.raises(KernelNotFoundError, match="gemm/bf16"):
        lookup("hopper", "gemm", "fp8")
    for _, variant in all_variants():
        assert (KERNEL_DIR / variant.source).is_file()


def test_split_size_is_the_same_for_every_attention_variant_of_a_target() -> None:
    """Results must not depend on the path taken: attention's split size is one number per target."""
    splits = {v.define("ATT_SPLIT", 0) for (t, op, _), v in all_variants() if op == "attention"}
    assert len(splits) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the compile-only check needs it")
def test_every_kernel_compiles_for_hopper_and_gb10() -> None:
    """Every registered kernel compiles for sm_90a and sm_121, and ptxas reports no performance loss (such as
    wgmma instructions serialised behind a divergent wait) in any of them (`compile_check.py`)."""
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "compile_check.py")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sm_90a" in result.stdout and "sm_121" in result.stdout


@pytest.mark.parametrize(
    ("k", "n", "n_tiles"),
    [  # the fastest decode tile of each shape measured on H100 (132 SMs; docs/benchmarks.md)
        (1024, 4096, 4),
        (1024, 6144, 4),
        (2048, 1024, 2),
        (3072, 1024, 1),
        (2048, 4608, 2),
        (4096, 2048, 1),
        (2048, 128, 2),
        (4096, 6144, 2),
        (14336, 4096, 2),
        (4096, 28672, 2),
    ],
)
def test_decode_tile_is_the_measured_fastest(k: int, n: int, n_tiles: int) -> None:
    from atlas_gb10.gemm_shapes import decode_n_tiles

    assert decode_n_tiles(n, k, sm_count=132) == n_tiles


@pytest.mark.parametrize(
    ("m", "k", "n", "kernel"),
    [  # the fastest prefill kernel of shapes measured on H100 (132 SMs; docs/benchmarks.md)
        (512, 4096, 6144, "gemm_wgmma"),
        (2048, 4096, 6144, "gemm_wgmma"),
        (8192, 4096, 4096, "gemm_wgmma"),
        (512, 4096, 4096, "gemm_wgmma"),
        (2048, 4096, 28672, "gemm_wgmma"),
        (2048, 14336, 4096, "gemm_wgmma"),
        (2048, 2048, 5120, "gemm_wgmma"),
        (512, 1024, 4096, "gemm_wgmma"),  # Qwen3-0.6B q/k/v: 128 tiles
        (2048, 2048, 1024, "gemm_wgmma"),  # Qwen3-0.6B o
        (8192, 3072, 1024, "gemm_wgmma"),  # Qwen3-0.6B down
        (512, 2048, 1024, None),  # 32 tiles: gemm.cu, K split over many blocks
        (512, 3072, 1024, None),
    ],
)
def test_prefill_kernel_is_the_measured_fastest(m: int, k: int, n: int, kernel: str | None) -> None:
    from atlas_gb10.gemm_shapes import prefill_kernel

    assert prefill_kernel(m, n, k, 132, True) == kernel
    assert prefill_kernel(m, n, k, 132, False) in ("gemm_tiled", None)  # other devices: the mma.sync kernels
    assert prefill_kernel(255, n, k, 132, True) is None  # decode-sized products keep gemm.cu
    assert prefill_kernel(300, 96, k, 132, True) is None  # 2 tiles: gemm.cu splits K over many more blocks


@pytest.mark.parametrize(
    ("tokens", "heads", "d", "half", "batched"),
    [  # measured on an H200 (132 SMs; docs/benchmarks.md): Qwen3-0.6B has 16 + 2 x 8 heads of 128
        (8192, 32, 128, 64, True),  # an 8k prefill: 47 against 100 us a layer
        (1, 32, 128, 64, False),  # batch-1 decode: batched, 2 blocks instead of 8 ran 876 against 906 tok/s
        (66, 32, 128, 64, True),  # 132 blocks: one an SM
        (65, 32, 128, 64, False),
        (8192, 48, 128, 32, False),  # partial rotary: the kernel that stages a head in shared memory
        (8192, 48, 96, 48, False),  # no kernel of its own for heads of 96
    ],
)
def test_attention_inputs_batch_heads_where_the_blocks_still_fill_the_sms(
    tokens: int, heads: int, d: int, half: int, batched: bool
) -> None:
    from atlas_gb10.attention_inputs import batches_heads

    assert batches_heads(tokens, heads, d, half, sm_count=132) == batched


@pytest.mark.parametrize(
    ("k", "n", "n_tiles"),
    [
        (4096, 28672, 2),
        (14336, 4096, 2),
        (4096, 6144, 2),
        (1024, 4096, 2),
        (2048, 5120, 2),
        (4096, 2048, 1),
        (2048, 1024, 1),
    ],
)
def test_quantized_decode_tile_is_the_measured_fastest(k: int, n: int, n_tiles: int) -> None:
    """One-row FP8 / NVFP4 / Q8_0 products on an H100 (gemm_tiles.py): two n-tiles a block, paired in each mma step,
    wherever that leaves a block for every SM; the 9..16-row kernels keep one n-tile below very wide outputs."""
    from atlas_gb10.gemm_shapes import gemm_tile

    for kind in ("fp8", "nvfp4", "gguf_q8_0"):
        assert gemm_tile(1, n, k, kind, 132) == (1, n_tiles)
        assert gemm_tile(8, n, k, kind, 132) == (1, n_tiles)
    assert gemm_tile(12, 6144, 4096, "fp8", 132) == (1, 1)


def test_three_block_decode_kernels_take_one_and_a_half_waves() -> None:
    """``vec8x3`` (three blocks an SM) where two n-tile blocks number 2-3 an SM (an H100's 264-396: Llama-3-8B and
    Qwen3-30B-A3B q/k/v), for the kinds that have it; ``vec8`` elsewhere."""
    from atlas_gb10.gemm_shapes import low8_loads

    for kind in ("fp8", "nvfp4", "gguf_q8_0"):
        assert low8_loads(kind, 6144, 2, 132) == low8_loads(kind, 5120, 2, 132) == "vec8x3"
        assert low8_loads(kind, 28672, 2, 132) == low8_loads(kind, 4096, 2, 132) == "vec8"
        assert low8_loads(kind, 1024, 1, 132) == "vec8"
    assert low8_loads("gguf_q4_k", 6144, 2, 132) == "vec8"


def test_checkpointed_sequences_take_the_recurrent_kernels() -> None:
    """Sequences with state checkpoints (speculative decoding's verify steps) are shorter than the chunked kernels'
    threshold, so the recurrent kernels, which write the checkpoints, take them in every call."""
    from atlas_gb10.recurrent import CHUNK_TOKENS
    from atlas_gb10.registry import GENERIC, lookup

    from atlas_core.backends.ops.checkpoints import CHECKPOINTED_TOKENS

    assert CHECKPOINTED_TOKENS <= CHUNK_TOKENS
    assert lookup(GENERIC, "recurrent", "bf16").define("CHECKPOINTED_TOKENS", 0) == CHECKPOINTED_TOKENS


@pytest.mark.parametrize(
    ("arch", "gib", "budget"),
    [("sm_90a", 80, 8192), ("sm_90a", 141, 8192), ("sm_90a", 64, 2048), ("sm_121", 128, 2048)],
)
def test_token_budget_is_larger_on_hopper_gpus_of_70_gib(arch: str, gib: int, budget: int) -> None:
    """8,192 tokens a step by default on Hopper GPUs of at least 70 GiB; GB10 (sm_121) and smaller GPUs keep 2,048."""
    from atlas_gb10.backend import CudaBackend

    backend = object.__new__(CudaBackend)
    backend.profile = SimpleNamespace(arch=arch)  # type: ignore[assignment]
    backend.device_memory = lambda: (gib * 2**29, gib * 2**30)  # type: ignore[method-assign]
    assert backend.default_token_budget() == budget
