"""The backend contract: arrays, memory and every op the layers call.

``docs/ops.md`` is the human-readable form of this contract. The NumPy backend is its executable
specification; the conformance suite (`tests/test_conformance_*.py`, shared fixtures and oracles in
`atlas_core.testing`) checks every installed backend (NumPy included) against independent
float64 oracles written from this contract.

Conventions for every op:
  * Shapes use T = tokens in the flattened batch, B = sequences, H = hidden size,
    Hq / Hk = query / key-value heads, D = head dim, V = vocab size.
  * Activations are in ``activation_dtype``; weights were uploaded through ``from_numpy`` and may
    be stored in another dtype; accumulation is at least fp32. Index arrays are int32.
  * ``out=`` (where offered) receives the result and is also returned; it must have the result's
    shape and dtype and must not alias an input. Without ``out`` a new array is returned.
  * Ops never synchronise with the host unless their result is a host value (``to_numpy``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from atlas_core.backends.inputs import (
    AttentionMetadata,
    Download,
    LogitAdjustments,
    ReadyDownload,
    SamplingTensors,
)
from atlas_core.backends.ops import OpGroup, on_host
from atlas_core.weights.quantized import QuantizedWeight, dequantize

if TYPE_CHECKING:
    from atlas_core.backends.transfers import HostTransfers
    from atlas_core.plugins import PluginRegistry

G = TypeVar("G", bound=OpGroup)
log = logging.getLogger("atlas.backends")

Array = Any
"""A backend's array type (``numpy.ndarray`` for the reference, ``cupy.ndarray`` on CUDA)."""
GATED_ACTIVATIONS = ("silu", "gelu_tanh")
"""The gate activations of `Backend.gated_linear`."""
__all__ = [
    "GATED_ACTIVATIONS",
    "Array",
    "AttentionMetadata",
    "Backend",
    "Download",
    "LogitAdjustments",
    "ReadyDownload",
    "SamplingTensors",
]
"""What the contract names; the ops' input records are defined in `atlas_core.backends.inputs`."""


class Backend(ABC):
    """Abstract array backend. Subclasses implement every abstract op with the documented contract.

    Ops that only some layers use live in op groups (`atlas_core.backends.ops`), reached with
    `ops`: each group runs natively where a plugin registered an implementation for this backend,
    and through its host fallback elsewhere, so every backend runs every model.
    """

    name: str = "abstract"
    activation_dtype: np.dtype = np.dtype(np.float32)
    quantized_formats: ClassVar[frozenset[str]] = frozenset()
    """The `QuantizedWeight` formats (`atlas_core.weights.quantized`) this backend executes as they are:
    its `linear` and its MoE experts accept such weights. Other formats are dequantized at load
    (`upload_quantized`)."""
    kv_cache_dtypes: ClassVar[frozenset[str]] = frozenset()
    """The ``kv_cache_dtype`` names (`atlas_core.backends.kv_dtypes`: ``bf16``, ``fp8``) this backend can hold
    its KV cache in besides its activation dtype (``auto``): its `write_kv` and `attention` take caches of
    those dtypes, and for ``fp8`` it implements `write_kv_scaled` and `attention_scaled`. The engine refuses
    others with a `ConfigError`."""
    prepares_decode_steps: ClassVar[bool] = True
    """Whether the engine may prepare each pure-decode step while the one before runs
    (`atlas_core.engine.lookahead`). It relies on what `sample` and `upload_int32` promise about the arrays they
    return; a backend that cannot keep those promises sets it False."""
    queues_work: ClassVar[bool] = False
    """Whether calls return before the device has run them (work is queued on a stream, as on CUDA). The engine
    then launches a predictable decode step before it reads the tokens of the step before
    (`atlas_core.engine.ahead`), through `download_async`. Backends that compute as they are called leave it
    False."""
    batch_invariant: bool = False
    """Set by the engine (``EngineConfig.batch_invariant``): True keeps every row's arithmetic independent of
    the rest of the batch (a backend whose fastest kernels trade that away keeps to its invariant ones)."""
    plugin_registry: PluginRegistry | None = None
    """The registry `ops` resolves native op-group implementations from (set by
    `atlas_core.backends.select.select_backend`; None: the process-wide registry)."""

    def ops(self, group: type[G]) -> G:
        """This backend's implementation of op group ``group``: the native one registered for
        ``self.name``, else ``group`` itself (host fallback). Resolved once per backend and group."""
        resolved: dict[type[OpGroup], OpGroup] = self.__dict__.setdefault("_op_groups", {})
        if group not in resolved:
            from atlas_core.backends.op_registry import resolve_op_group
            from atlas_core.plugins import get_registry

            registry = self.plugin_registry if self.plugin_registry is not None else get_registry()
            resolved[group] = resolve_op_group(registry, self.name, group)(self)
        return resolved[group]  # type: ignore[return-value]

    @classmethod
    def availability(cls) -> str | None:
        """None when this backend can run here, else a sentence saying why not."""
        return None

    def device_memory(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes of device memory, or None for host-memory backends (the engine then
        sizes the KV cache from ``kv_cache_memory_gib`` instead of ``gpu_memory_utilization``)."""
        return None

    def default_token_budget(self) -> int:
        """The step's token budget when ``max_num_batched_tokens`` is unset (the engine asks once): 2048 here. A
        device backend may give more where its prefill gains from fewer, larger chunks, at the cost of longer steps
        for the sequences decoding beside one."""
        return 2048

    def decode_graphs(self, model: Any, kv: Any) -> Any:
        """Captured pure-decode steps for ``model`` over ``kv`` (`atlas_core.engine.decode_graphs.DecodeGraphs`),
        or None when this backend runs everything eagerly."""
        return None

    # ---- memory -------------------------------------------------------------------------
    @abstractmethod
    def from_numpy(self, array: np.ndarray, *, weight: bool = False, dtype: np.dtype | None = None) -> Array:
        """Copy a host array to the backend. ``dtype`` forces the stored dtype; otherwise
        ``weight=True`` stores floats in the backend's weight dtype, other floats become
        ``activation_dtype``, and integers int32."""

    def upload_int32(self, arrays: Sequence[np.ndarray]) -> list[Array]:
        """int32 copies of several small host integer arrays (a step's metadata), in order and of the same
        shapes. Backends with a cost per copy override it to send them together. The copies are the caller's:
        later uploads must not reuse their memory (the engine prepares a step's metadata a step early)."""
        return [self.from_numpy(np.asarray(array), dtype=np.dtype(np.int32)) for array in arrays]

    def keeps_quantized(self, weight: QuantizedWeight) -> bool:
        """Whether `upload_quantized` keeps ``weight`` quantized: its format is in `quantized_formats` (a
        backend whose kernels take only some layouts of a format, such as some scale blocks, narrows it)."""
        return weight.format in self.quantized_formats

    def upload_quantized(self, weight: QuantizedWeight) -> Array | QuantizedWeight:
        """Upload a host `QuantizedWeight` (a linear weight ``[N, K]`` or an expert bank ``[E, N, K]``).

        When `keeps_quantized` says so the result is the same `QuantizedWeight` with its
        ``data`` and ``scales`` uploaded (``from_numpy`` keeping their dtypes): it stays quantized in
        memory and `linear` / ``moe_experts`` receive it as such. Otherwise the weight is dequantized on
        the host and uploaded as an ordinary weight (``from_numpy(..., weight=True)``), logging once per
        format that it takes the weight dtype's memory instead. A backend with its own layout overrides this."""
        if self.keeps_quantized(weight):
            return weight.map_arrays(lambda array: self.from_numpy(array, dtype=array.dtype))
        warned: set[str] = self.__dict__.setdefault("_dequantized_formats", set())
        if weight.format not in warned:
            warned.add(weight.format)
            log.warning(
                "backend %r does not execute %s weights such as %r; they are dequantized at load and take the "
                "memory of its weight dtype instead (quantized formats it executes: %s)",
                self.name,
                weight.format,
                weight,
                ", ".join(sorted(self.quantized_formats)) or "none",
            )
        return self.from_numpy(dequantize(weight), weight=True)

    @abstractmethod
    def to_numpy(self, x: Array) -> np.ndarray:
        """Copy to the host (synchronises)."""

    def download_async(self, x: Array) -> Download:
        """Start copying ``x`` to the host, ordered after the work queued so far: the result's ``result()`` waits for
        that copy alone, not for work queued after this call. Backends that queue work override it; this one copies
        at once."""
        return ReadyDownload(self.to_numpy(x))

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type) -> Array:
        """A zero-filled array whose memory is committed now: a host backend must not hand out lazily
        mapped pages, or the KV cache (allocated once at start) would grow the process block by block
        as requests use it."""

    def host_transfers(self) -> HostTransfers:
        """New device <-> host row copies for the KV storage tiers (`atlas_core.backends.transfers`), kept by
        the caller: synchronous here; a device backend returns copies on their own stream."""
        from atlas_core.backends.transfers import HostTransfers

        return HostTransfers(self)

    # ---- ops ----------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, weight: Array, ids: Array) -> Array:
        """Rows of ``weight[V, H]`` for ``ids[T]`` -> ``[T, H]`` activations."""

    @abstractmethod
    def linear(
        self, x: Array, weight: Array | QuantizedWeight, bias: Array | None = None, out: Array | None = None
    ) -> Array:
        """``x[T, K] @ weight[N, K].T (+ bias[N])`` -> ``[T, N]``. ``weight`` may be a `QuantizedWeight`
        of a format in `quantized_formats` (uploaded by `upload_quantized`): the product is then that of
        its dequantized values."""

    @abstractmethod
    def rms_norm(self, x: Array, weight: Array, eps: float, residual: Array | None = None) -> tuple[Array, Array]:
        """Fused residual add + RMSNorm over the last axis.

        ``s = x + residual`` (or ``x`` when residual is None); returns
        ``(s / sqrt(mean(s**2) + eps) * weight, s)``. The second result is the new residual stream.
        Works for any leading shape (``[T, H]`` or per-head ``[T, heads, D]``).
        """

    @abstractmethod
    def silu_mul(self, x: Array, out: Array | None = None) -> Array:
        """SwiGLU activation: ``x[T, 2I]`` = [gate | up] -> ``silu(gate) * up`` ``[T, I]``."""

    @abstractmethod
    def gelu_tanh_mul(self, x: Array, out: Array | None = None) -> Array:
        """GeGLU activation (Gemma): ``x[T, 2I]`` = [gate | up] -> ``gelu_tanh(gate) * up`` ``[T, I]``,
        ``gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))``."""

    def gated_linear(
        self, x: Array, weight: Array | QuantizedWeight, activation: str, bias: Array | None = None
    ) -> Array:
        """A gated feed-forward's first product: ``linear(x, weight, bias)``, whose ``[T, 2I]`` result is
        [gate | up], through its gate ``activation`` (``"silu"``: `silu_mul`; ``"gelu_tanh"``: `gelu_tanh_mul`)
        -> ``[T, I]``. A backend may fuse the two; its results must be those of the two ops (the same bits).
        Raises ValueError for another activation."""
        if activation not in GATED_ACTIVATIONS:
            raise ValueError(f"gated_linear: activation {activation!r} is not one of {', '.join(GATED_ACTIVATIONS)}")
        product = self.linear(x, weight, bias)
        return self.silu_mul(product) if activation == "silu" else self.gelu_tanh_mul(product)

    @abstractmethod
    def rope(self, q: Array, k: Array, positions: Array, cos: Array, sin: Array) -> None:
        """Rotary embedding in place, rotate-half (NeoX) layout, on the first ``2 * cos.shape[1]``
        dims of each head. ``q[T, Hq, D]``, ``k[T, Hk, D]``, ``positions[T]``,
        ``cos``/``sin`` ``[max_positions, R/2]`` float32 tables (scaling already applied)."""

    @abstractmethod
    def write_kv(self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array) -> None:
        """Store ``k``/``v`` ``[T, Hk, D]`` into caches ``[num_blocks, block_size, Hk, D]`` at flat
        slots ``slot_mapping[T]``; a slot of -1 skips that token."""

    def write_kv_scaled(
        self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array, k_scale: float, v_scale: float
    ) -> None:
        """`write_kv` into scaled (fp8 E4M3) caches: each stored value is ``E4M3(clip(x / scale, -448, 448))``,
        rounded to nearest even, with ``k_scale`` for keys and ``v_scale`` for values
        (`atlas_core.backends.kv_dtypes.quantize_kv`). Only backends listing ``fp8`` in `kv_cache_dtypes`."""
        raise NotImplementedError(f"the {self.name!r} backend does not hold fp8 KV caches")

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
        """The attention layer's steps between the QKV projection and attention, as one op:
        per-head RMSNorm of q and of k (each skipped when its weight is None), `rope` on both, then
        `write_kv` of the rotated k and of v (`write_kv_scaled` with ``kv_scales`` = ``(k_scale, v_scale)``
        for scaled caches). ``q[T, Hq, D]``, ``k``/``v`` ``[T, Hk, D]`` (strided views allowed). Returns the
        rotated queries ``[T, Hq, D]``; ``q`` and ``k`` may be overwritten.

        Each step rounds to the activation dtype as the separate ops do. Backends may fuse it; this
        default composes `rms_norm`, `rope` and `write_kv` / `write_kv_scaled`."""
        if q_norm_weight is not None:
            q = self.rms_norm(q, q_norm_weight, eps)[0]
        if k_norm_weight is not None:
            k = self.rms_norm(k, k_norm_weight, eps)[0]
        self.rope(q, k, positions, cos, sin)
        if kv_scales is None:
            self.write_kv(k_cache, v_cache, k, v, slot_mapping)
        else:
            self.write_kv_scaled(k_cache, v_cache, k, v, slot_mapping, *kv_scales)
        return q

    @abstractmethod
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
        """Causal paged attention with GQA (``Hq`` a multiple of ``Hk``) for a varlen batch mixing
        prefill chunks and decode tokens. ``q[T, Hq, D]`` -> ``[T, Hq, D]``; keys and values are
        read from the caches (this step's tokens must already be written). Rows see further keys where
        ``meta.visible_end`` says so.

        ``sliding_window`` W (None: unlimited): a query at position p sees keys ``max(0, p - W + 1) ..= p``
        (W keys including itself, the Hugging Face convention). Block-table entries of blocks that lie
        wholly before every query's window may be -1 or point at stale data: they must not be read."""

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
        """`attention` over scaled (fp8 E4M3) caches written by `write_kv_scaled`: every key reads as its
        stored value times ``k_scale`` and every value times ``v_scale`` (``scale`` is the softmax scale, as in
        `attention`). Only backends listing ``fp8`` in `kv_cache_dtypes`."""
        raise NotImplementedError(f"the {self.name!r} backend does not hold fp8 KV caches")

    def sigmoid_gate(self, x: Array, gate: Array) -> Array:
        """``x[T, N] * sigmoid(gate)`` with ``gate[T, 1]`` (one gate per token, e.g. a shared expert's
        gate) or ``gate[T, N]`` (elementwise, e.g. gated attention's output gate); the sigmoid in
        float32. Returns a new ``[T, N]`` array in ``x``'s dtype. Default: the host reference."""
        from atlas_core.backends.ops.moe import sigmoid_gate_reference

        return on_host(self, sigmoid_gate_reference, x, gate)

    def sigmoid_gate_add(self, out: Array, x: Array, gate: Array) -> Array:
        """``out += x * sigmoid(gate)`` in place (a MoE block adding its gated shared expert to the routed
        experts' sum), ``out`` a contiguous ``[T, N]`` array of ``x``'s dtype, ``gate`` as in `sigmoid_gate`;
        returns ``out``. Default: `sigmoid_gate`, then the addition; a backend may fuse the two (one rounding)."""
        out += self.sigmoid_gate(x, gate)
        return out

    @abstractmethod
    def log_softmax(self, logits: Array) -> Array:
        """Row-wise log-softmax of ``[S, V]`` in float32."""

    @abstractmethod
    def argmax(self, logits: Array) -> Array:
        """Row-wise argmax ``[S, V]`` -> int32 ``[S]`` (lowest index on ties)."""

    @abstractmethod
    def adjust_logits(self, logits: Array, adj: LogitAdjustments) -> None:
        """Apply penalties and biases to ``logits[S, V]`` (activation dtype) in place.

        For each penalty entry (row r, token t, output count c, in_prompt): first the repetition
        penalty ``p = repetition_penalty[r]`` when t is in the prompt or c > 0 (``l / p`` if
        ``l > 0`` else ``l * p``), then ``l -= frequency_penalty[r] * c + presence_penalty[r] * (c > 0)``.
        Then every bias entry adds its value (duplicates add up; -inf bans the token). Nothing else
        changes. An empty `LogitAdjustments` must cost next to nothing.
        """

    @abstractmethod
    def sample(self, logits: Array, params: SamplingTensors) -> Array:
        """Draw one token per row ``[S, V]`` -> int32 ``[S]``.

        Per row: temperature 0 -> argmax. Otherwise ``z = logits / T``, ``p = softmax(z)``; in
        descending-probability order (ties by lower id) keep: with top_n_sigma n > 0, the tokens
        with ``z >= max(z) - n * std(z)`` (population std over the row's finite entries); of those
        the top_k most likely; then the smallest prefix of those (renormalised) whose mass reaches
        top_p (the token crossing it included); then tokens with ``p >= min_p * max(p)``;
        renormalise and return the token where the cumulative mass first exceeds
        ``uniform * total``.

        The result is a new contiguous array of this backend's own type, which nothing later overwrites: the
        engine feeds it to the next decode step as its token ids (`atlas_core.engine.lookahead`).
        """
