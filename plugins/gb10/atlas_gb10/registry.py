"""The kernel registry: (hardware target, op, dtype/quant) -> which CUDA source and compile-time
constants implement it, with ``generic`` fallbacks (the Python form of ``kernels/<hw>/<op>/<quant>/``).

Every source lives in ``atlas_gb10/kernels/`` and compiles for every target (Hopper sm_90a and GB10
sm_121 are checked by ``scripts/compile_check.py``); a target entry exists only where it differs: other
tile sizes for a smaller shared memory, say. Constants that change results (attention's split size)
must be the same for all entries of one target, so that results never depend on the path taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from atlas_core.backends.ops.checkpoints import CHECKPOINTED_TOKENS

KERNEL_DIR = Path(__file__).parent / "kernels"


@dataclass(frozen=True)
class KernelVariant:
    """A CUDA source file and the ``-D`` constants it is compiled with."""

    source: str
    defines: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    def define(self, name: str, default: int) -> int:
        return dict(self.defines).get(name, default)


GENERIC = "generic"
GGUF_BLOCK_TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q4_k": 12, "q5_k": 13, "q6_k": 14}
"""GGUF block formats with kernels of their own (besides Q8_0) -> their GGML type id (``GGUF_TYPE``)."""

REGISTRY: dict[tuple[str, str, str], KernelVariant] = {
    (GENERIC, "elementwise", "bf16"): KernelVariant("elementwise.cu"),
    (GENERIC, "rms_norm", "bf16"): KernelVariant("rms_norm.cu"),
    (GENERIC, "attention_inputs", "bf16"): KernelVariant("attention_inputs.cu"),
    (GENERIC, "gemm", "bf16"): KernelVariant("gemm.cu", (("GEMM_KSPLIT", 8),)),
    (GENERIC, "gemm_tiled", "bf16"): KernelVariant("gemm_tiled.cu"),
    # Hopper: prefill products on wgmma (the kernel traps elsewhere; the host takes it on sm_90a only)
    ("hopper", "gemm_wgmma", "bf16"): KernelVariant("gemm_wgmma.cu"),
    # Hopper: prefill attention on wgmma for 128-wide heads over bf16 caches (likewise taken on sm_90a only)
    ("hopper", "attention_wgmma", "bf16"): KernelVariant("attention_wgmma.cu"),
    # GGUF block formats besides Q8_0: gemm.cu and moe.cu built with one format's kernels (gemm_gguf_blocks.cuh)
    **{
        (GENERIC, op, f"gguf_{name}"): KernelVariant(f"{op}.cu", (("GEMM_KSPLIT", 8), ("GGUF_TYPE", ggml_type)))
        for op in ("gemm", "moe")
        for name, ggml_type in GGUF_BLOCK_TYPES.items()
    },
    (GENERIC, "attention", "bf16"): KernelVariant("attention.cu", (("ATT_TILE_N", 64), ("ATT_SPLIT", 64))),
    (GENERIC, "attention_mma", "bf16"): KernelVariant("attention_mma.cu"),
    (GENERIC, "attention_decode", "bf16"): KernelVariant("attention_decode.cu"),
    # fp8 (E4M3) KV caches: the same kernels reading bytes (paged_kv.cuh's KV_FP8)
    (GENERIC, "attention", "fp8"): KernelVariant(
        "attention.cu", (("ATT_TILE_N", 64), ("ATT_SPLIT", 64), ("KV_FP8", 1))
    ),
    (GENERIC, "attention_mma", "fp8"): KernelVariant("attention_mma.cu", (("KV_FP8", 1),)),
    (GENERIC, "attention_decode", "fp8"): KernelVariant("attention_decode.cu", (("KV_FP8", 1),)),
    (GENERIC, "logits", "bf16"): KernelVariant("logits.cu"),
    (GENERIC, "moe", "bf16"): KernelVariant("moe.cu", (("GEMM_KSPLIT", 8),)),
    (GENERIC, "mla", "bf16"): KernelVariant("mla.cu", (("MLA_TILE_N", 64), ("MLA_SPLIT", 256))),
    (GENERIC, "recurrent", "bf16"): KernelVariant("recurrent.cu", (("CHECKPOINTED_TOKENS", CHECKPOINTED_TOKENS),)),
    (GENERIC, "chunked_scan", "bf16"): KernelVariant("chunked_scan.cu"),
    # GB10: 99 KiB of shared memory per block, so attention uses half-size key tiles.
    ("gb10", "attention", "bf16"): KernelVariant("attention.cu", (("ATT_TILE_N", 32), ("ATT_SPLIT", 64))),
    ("gb10", "attention", "fp8"): KernelVariant("attention.cu", (("ATT_TILE_N", 32), ("ATT_SPLIT", 64), ("KV_FP8", 1))),
    ("gb10", "mla", "bf16"): KernelVariant("mla.cu", (("MLA_TILE_N", 32), ("MLA_SPLIT", 256))),
}
"""(target, op, dtype) -> variant. Lookups fall back to the ``generic`` target."""


class KernelNotFoundError(LookupError):
    """No kernel is registered for an op and dtype, neither for the target nor generically."""


def lookup(target: str, op: str, dtype: str) -> KernelVariant:
    """The variant for ``target``, else the generic one."""
    for key in ((target, op, dtype), (GENERIC, op, dtype)):
        if key in REGISTRY:
            return REGISTRY[key]
    known = sorted({f"{o}/{d}" for _, o, d in REGISTRY})
    raise KernelNotFoundError(f"no kernel for op {op!r} with dtype {dtype!r} (registered: {', '.join(known)})")


def all_variants() -> list[tuple[tuple[str, str, str], KernelVariant]]:
    """Every registry entry (for the compile checks)."""
    return sorted(REGISTRY.items())
