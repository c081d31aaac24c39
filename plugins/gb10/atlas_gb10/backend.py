"""The ``cuda`` backend: CuPy arrays in bfloat16, every core op a CUDA kernel from the registry.

Importing this module does not import CuPy; `CudaBackend.availability` and the constructor do.
Activations and weights are bf16 (``ml_dtypes.bfloat16``); accumulation is fp32. Every op computes a
row the same way whatever the batch (see the kernel sources), so greedy outputs are batch invariant
and captured decode graphs reproduce the eager forward bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from atlas_core.backends.base import (
    Array,
    AttentionMetadata,
    Backend,
    Download,
    LogitAdjustments,
    SamplingTensors,
)
from atlas_core.backends.kv_dtypes import FP8_E4M3
from atlas_core.weights.quantized import QuantizedWeight
from atlas_gb10 import attention_inputs, rowwise
from atlas_gb10.arrays import BF16, FP8_CACHE, element_strides, loads_16_bytes, null_or
from atlas_gb10.attention import AttentionRunner
from atlas_gb10.download import PinnedDownload
from atlas_gb10.gemm_shapes import GATED_MIN_K, WGMMA, gemm_tile, low8_loads, prefill_kernel
from atlas_gb10.hardware import has_wgmma
from atlas_gb10.prefill_products import (
    GATED_DECODE_ROWS,
    GATED_KERNELS,
    gated_decode_product,
    gated_wgmma_product,
    prefill_product,
)
from atlas_gb10.quantized_weights import (
    FORMATS,
    executes_natively,
    gemm_loads,
    gemm_module,
    upload_native,
    weight_operand,
)
from atlas_gb10.sampling import LogitsOps

LARGE_TOKEN_BUDGET, LARGE_BUDGET_GIB = 8192, 70
"""`CudaBackend.default_token_budget` of Hopper GPUs with at least this much memory (GiB)."""


class CudaBackend(Backend):
    """CUDA through CuPy; kernels compiled at run time for the detected hardware target."""

    name = "cuda"
    activation_dtype = BF16
    quantized_formats = FORMATS
    kv_cache_dtypes = frozenset({"fp8"})
    queues_work = True

    @classmethod
    def availability(cls) -> str | None:
        try:
            import cupy
        except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run here"
            return f"CuPy cannot be imported ({type(exc).__name__}: {exc}); install cupy-cuda13x"
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001
            return f"no CUDA driver or device is usable ({type(exc).__name__}: {exc})"
        if count == 0:
            return "no CUDA device is visible"
        capability = int(cupy.cuda.Device(0).compute_capability)
        if capability < 80:
            return (
                f"the GPU has compute capability {capability // 10}.{capability % 10}; "
                "bf16 tensor-core kernels need 8.0 or newer"
            )
        try:
            from cupy_backends.cuda.libs import nvrtc

            nvrtc.getVersion()
        except Exception as exc:  # noqa: BLE001
            return (
                f"NVRTC, the CUDA run-time compiler, cannot be loaded ({exc}); "
                "install nvidia-cuda-nvrtc or a CUDA toolkit"
            )
        return None

    def __init__(self) -> None:
        import cupy

        from atlas_gb10.compiler import KernelLibrary
        from atlas_gb10.hardware import detect
        from atlas_gb10.upload import PinnedUploader

        self.cp = cupy
        self.profile = detect(cupy)
        self.kernels = KernelLibrary(cupy, self.profile)
        self.uploader = PinnedUploader(cupy)
        self.device_name = (
            f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()} ({self.profile.name}, {self.profile.arch})"
        )
        self.attention_runner = AttentionRunner(self)
        self.logits_ops = LogitsOps(self)

    # ---- memory -------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray, *, weight: bool = False, dtype: np.dtype | None = None) -> Array:
        array = np.asarray(array)
        if dtype is not None:
            target = np.dtype(dtype)
        elif array.dtype.kind in "iub":
            target = np.dtype(np.int32)
        else:
            target = BF16
        return self.uploader.upload(array, target)

    def upload_int32(self, arrays: Sequence[np.ndarray]) -> list[Array]:
        """One pinned copy for all of a step's metadata (`PinnedUploader.upload_int32`)."""
        return self.uploader.upload_int32(arrays)

    def keeps_quantized(self, weight: QuantizedWeight) -> bool:
        """NVFP4, the GGUF block formats, and FP8 in scale blocks the kernels take
        (`atlas_gb10.quantized_weights.executes_natively`)."""
        return executes_natively(weight)

    def upload_quantized(self, weight: QuantizedWeight) -> Array | QuantizedWeight:
        """FP8, NVFP4 and GGUF block weights stay quantized on the device (`atlas_gb10.quantized_weights`); other
        formats and FP8 scale blocks the kernels do not take are dequantized at load (bf16), with the base class's
        log line."""
        if self.keeps_quantized(weight):
            return upload_native(self, weight)
        return super().upload_quantized(weight)

    def to_numpy(self, x: Array) -> np.ndarray:
        return self.cp.asnumpy(x)

    def download_async(self, x: Array) -> Download:
        """Through pinned memory, waiting for this copy alone (`atlas_gb10.download`)."""
        return PinnedDownload(self.cp, x)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type) -> Array:
        """Zeros of ``dtype``; fp8 (E4M3) ones as their bytes (`atlas_gb10.arrays.FP8_CACHE`: fp8 KV caches)."""
        dtype = np.dtype(dtype)
        return self.cp.zeros(shape, dtype=FP8_CACHE if dtype == FP8_E4M3 else dtype)

    def device_memory(self) -> tuple[int, int] | None:
        self.cp.get_default_memory_pool().free_all_blocks()
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def default_token_budget(self) -> int:
        """`LARGE_TOKEN_BUDGET` on Hopper GPUs of at least `LARGE_BUDGET_GIB` GiB, else the contract's: an 8k-token
        prompt then prefills in one step (measured on an H200: docs/benchmarks.md), as vLLM serves on such devices.
        GB10 keeps 2048 until its prefill is measured (it has a fraction of Hopper's matrix rate)."""
        memory = self.device_memory()
        if has_wgmma(self.profile.arch) and memory is not None and memory[1] >= LARGE_BUDGET_GIB * 2**30:
            return LARGE_TOKEN_BUDGET
        return super().default_token_budget()

    def host_transfers(self) -> Any:
        """The KV storage tiers' copies on their own stream, through pinned buffers (`atlas_gb10.transfers`)."""
        from atlas_gb10.transfers import CudaHostTransfers

        return CudaHostTransfers(self, self.cp)

    def decode_graphs(self, model: Any, kv: Any) -> Any:
        from atlas_gb10.graphs import CudaDecodeGraphs, graphs_enabled

        if not graphs_enabled():
            return None
        return CudaDecodeGraphs(self, model, kv)

    # ---- helpers ------------------------------------------------------------------------
    def _kernel(self, op: str, name: str) -> Any:
        return self.kernels.function(op, name)

    def contiguous_rows(self, x: Array) -> Array:
        """``x`` with a contiguous last axis (a copy only when it is not)."""
        return x if x.strides[-1] == x.itemsize else self.cp.ascontiguousarray(x)

    def require_bf16(self, op: str, *arrays: Array) -> None:
        for a in arrays:
            if a is not None and a.dtype != BF16:
                raise TypeError(f"cuda backend: {op} takes bfloat16 arrays, got {a.dtype}")

    # ---- dense ops ----------------------------------------------------------------------
    def embedding(self, weight: Array, ids: Array) -> Array:
        self.require_bf16("embedding", weight)
        hidden = weight.shape[1]
        out = self.cp.empty((ids.shape[0], hidden), dtype=BF16)
        if ids.shape[0]:
            self._kernel("elementwise", "embedding_bf16")((ids.shape[0],), (128,), (weight, ids, out, np.int32(hidden)))
        return out

    def linear(
        self, x: Array, weight: Array | QuantizedWeight, bias: Array | None = None, out: Array | None = None
    ) -> Array:
        quantized = isinstance(weight, QuantizedWeight)
        self.require_bf16("linear", x, None if quantized else weight, bias)
        x = self.contiguous_rows(x)
        m, k = x.shape
        n = weight.shape[0]
        if out is None:
            out = self.cp.empty((m, n), dtype=BF16)
        if m == 0:
            return out
        ldx, ldo = element_strides(x)[0], element_strides(out)[0]
        kind, weight_args, weight_aligned = weight_operand(weight)
        vec = loads_16_bytes(x, ldx, k, weight_aligned)
        prefill = self.prefill_gemm(m, n, k) if kind == "bf16" and vec else None
        if prefill is not None:
            return prefill_product(self, prefill, x, ldx, weight, bias, out, ldo, m, n, k)
        mt, nt = self.gemm_tile(m, n, k, kind)
        loads = gemm_loads(kind, vec, m)
        if loads == "vec8":
            loads = low8_loads(kind, n, nt, self.profile.sm_count)
        name = f"gemm_{kind}_m{mt}_n{nt}_{loads}"
        kernel = self.kernels.function("gemm", name, gemm_module(kind))
        grid = (math.ceil(n / (8 * nt)), math.ceil(m / (16 * mt)))
        kernel(
            grid,
            (256,),
            (x, np.int64(ldx), *weight_args, null_or(bias), out, np.int64(ldo), np.int32(m), np.int32(n), np.int32(k)),
        )
        return out

    def gated_linear(
        self, x: Array, weight: Array | QuantizedWeight, activation: str, bias: Array | None = None
    ) -> Array:
        """gemm.cu's gated kernel for decode-sized products (at most `GATED_DECODE_ROWS` rows), gemm_wgmma.cu's
        where it takes the product (`prefill_gemm`) and the product is at least `GATED_MIN_K` deep, the default
        elsewhere: the same bits either way."""
        m, k = x.shape
        if isinstance(weight, QuantizedWeight) or activation not in GATED_KERNELS or weight.shape[0] % 2 or m == 0:
            return super().gated_linear(x, weight, activation, bias)
        self.require_bf16("gated_linear", x, weight, bias)
        x = self.contiguous_rows(x)
        ldx = element_strides(x)[0]
        aligned = loads_16_bytes(x, ldx, k, weight_operand(weight)[2])
        if aligned and m <= GATED_DECODE_ROWS:
            return gated_decode_product(self, activation, x, ldx, weight, bias, m, k)
        if not aligned or k < GATED_MIN_K or self.prefill_gemm(m, weight.shape[0], k) != WGMMA:
            return super().gated_linear(x, weight, activation, bias)
        return gated_wgmma_product(self, activation, x, ldx, weight, bias, m, k)

    def prefill_gemm(self, m: int, n: int, k: int) -> str | None:
        """The prefill kernel of an ``[m, n]`` bf16 product over ``k`` (`gemm_shapes.prefill_kernel`): none in the
        batch-invariant mode, gemm_wgmma.cu's only on Hopper (sm_90a)."""
        if self.batch_invariant:
            return None
        return prefill_kernel(m, n, k, self.profile.sm_count, has_wgmma(self.profile.arch))

    def gemm_tile(self, m: int, n: int, k: int, kind: str = "bf16") -> tuple[int, int]:
        """The block tile of gemm.cu for an ``[m, n]`` output over ``k`` (`gemm_shapes.gemm_tile`)."""
        return gemm_tile(m, n, k, kind, self.profile.sm_count)

    def rms_norm(self, x: Array, weight: Array, eps: float, residual: Array | None = None) -> tuple[Array, Array]:
        return rowwise.rms_norm(self, x, weight, eps, residual)

    def silu_mul(self, x: Array, out: Array | None = None) -> Array:
        return rowwise.gated(self, "silu_mul_bf16", x, out)

    def gelu_tanh_mul(self, x: Array, out: Array | None = None) -> Array:
        return rowwise.gated(self, "gelu_tanh_mul_bf16", x, out)

    def rope(self, q: Array, k: Array, positions: Array, cos: Array, sin: Array) -> None:
        attention_inputs.rope(self, q, k, positions, cos, sin)

    def write_kv(self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array) -> None:
        attention_inputs.write_kv(self, k_cache, v_cache, k, v, slot_mapping)

    def write_kv_scaled(
        self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array, k_scale: float, v_scale: float
    ) -> None:
        attention_inputs.write_kv(self, k_cache, v_cache, k, v, slot_mapping, (k_scale, v_scale))

    def qk_norm_rope_write_kv(
        self,
        q: Array,
        k: Array,
        v: Array,
        q_norm_weight: Array | None,
        k_norm_weight: Array | None,
        eps: float,
        positions: Array,
        cos: Array,
        sin: Array,
        k_cache: Array,
        v_cache: Array,
        slot_mapping: Array,
        kv_scales: tuple[float, float] | None = None,
    ) -> Array:
        """One kernel for the per-head norms, RoPE and the KV write (`atlas_gb10.attention_inputs`)."""
        return attention_inputs.qk_norm_rope_write_kv(
            self,
            q,
            k,
            v,
            q_norm_weight,
            k_norm_weight,
            eps,
            positions,
            cos,
            sin,
            k_cache,
            v_cache,
            slot_mapping,
            kv_scales,
        )

    def attention(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        out: Array | None = None,
        sliding_window: int | None = None,
    ) -> Array:
        self.require_bf16("attention", q, out)
        return self.attention_runner(q, k_cache, v_cache, meta, scale, out, sliding_window)

    def attention_scaled(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        k_scale: float,
        v_scale: float,
        sliding_window: int | None = None,
    ) -> Array:
        self.require_bf16("attention", q)
        return self.attention_runner(q, k_cache, v_cache, meta, scale, None, sliding_window, (k_scale, v_scale))

    # ---- logits ops ---------------------------------------------------------------------
    def log_softmax(self, logits: Array) -> Array:
        return self.logits_ops.log_softmax(logits)

    def argmax(self, logits: Array) -> Array:
        return self.logits_ops.argmax(logits)

    def adjust_logits(self, logits: Array, adj: LogitAdjustments) -> None:
        self.logits_ops.adjust(logits, adj)

    def sample(self, logits: Array, params: SamplingTensors) -> Array:
        return self.logits_ops.sample(logits, params)

    def sigmoid_gate(self, x: Array, gate: Array) -> Array:
        return self._sigmoid_gate(self.cp.empty(x.shape, dtype=BF16), x, gate, accumulate=False)

    def sigmoid_gate_add(self, out: Array, x: Array, gate: Array) -> Array:
        if out.shape != x.shape or out.dtype != BF16 or not out.flags.c_contiguous:
            raise ValueError(
                f"cuda backend: sigmoid_gate_add adds into a contiguous bf16 array of x's shape {tuple(x.shape)}, "
                f"got {out.dtype} {tuple(out.shape)}"
            )
        return self._sigmoid_gate(out, x, gate, accumulate=True)

    def _sigmoid_gate(self, out: Array, x: Array, gate: Array, *, accumulate: bool) -> Array:
        self.require_bf16("sigmoid_gate", x, gate)
        x, gate = self.contiguous_rows(x), self.contiguous_rows(gate)
        rows, cols = x.shape
        if gate.shape not in ((rows, 1), (rows, cols)):
            raise ValueError(
                f"cuda backend: sigmoid_gate takes a gate of shape ({rows}, 1) or {tuple(x.shape)}, "
                f"got {tuple(gate.shape)}"
            )
        total = rows * cols
        if total:
            blocks = min(math.ceil(total / 256), 8 * max(1, self.profile.sm_count))
            self._kernel("elementwise", "sigmoid_gate_bf16")(
                (blocks,),
                (256,),
                (
                    x,
                    np.int64(element_strides(x)[0]),
                    gate,
                    np.int64(element_strides(gate)[0]),
                    np.int32(gate.shape[1]),
                    out,
                    np.int32(cols),
                    np.int64(rows),
                    np.int32(accumulate),
                ),
            )
        return out
