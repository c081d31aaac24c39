"""Mixture-of-Experts feed-forward: a top-k router over routed experts, plus optional shared experts.

One design covers the MoE families (qwen3_moe, minimax_m2, deepseek_v3, mistral4, gemma4,
qwen3_next / qwen3_5_moe, nemotron_h):

    weights, ids = moe_route(router_input @ router_weight.T, spec, correction_bias)   # [T, k] each
    out = moe_experts(x, w_in, w_out, weights, ids, activation)                      # [T, H]
    out += shared_expert(x) [* sigmoid(x @ shared_expert_gate.T)]                    # optional

``router_input`` is ``x`` unless the caller passes another tensor (Gemma-4 routes on a differently
normed copy of the residual). Family quirks that are a fixed rescaling fold into the weights at load
time, exactly: Gemma-4's router-input scale ``scale * hidden_size**-0.5`` multiplies the columns of
the router weight, and its ``per_expert_scale[e]`` multiplies ``w_out[e]`` (the expert output is
linear in ``w_out``). Nemotron-H's latent projections wrap the expert call: the family calls
`MoEFeedForward.route` on ``x`` and `RoutedExperts` on the projected tokens itself.

Checkpoints store experts per expert (``{prefix}{e}.gate_proj.weight`` ..., ``w1/w3/w2`` in
MiniMax) or fused (``{prefix}gate_up_proj`` ``[E, 2I, H]``, ``{prefix}down_proj`` ``[E, H, I]``,
transformers 5's in-memory layout); `read_experts` accepts both, and `load_moe` builds the whole block
from a checkpoint prefix. Quantized experts (FP8 checkpoints) stay quantized through `load_moe`: the
banks are `QuantizedWeight`s that ``moe_experts`` receives as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.moe import (
    GATED_ACTIVATIONS,
    ExpertActivation,
    MoEOps,
    RouterSpec,
    Scoring,
    check_expert_shapes,
)
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.expert_parallel import ExpertShard, read_expert_shard
from atlas_core.model.transformer import FeedForward
from atlas_core.weights.quantized import QuantizedWeight, concat_rows, stack_experts

if TYPE_CHECKING:
    from atlas_core.model.loader import ModelWeightLoader

__all__ = [
    "MINIMAX_EXPERT_NAMES",
    "NON_GATED_EXPERT_NAMES",
    "ExpertNames",
    "Experts",
    "MoEFeedForward",
    "RoutedExperts",
    "RouterSpec",
    "config_num_experts",
    "fused_expert_shapes",
    "load_moe",
    "read_experts",
    "router_spec_from_config",
]

NUM_EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Config keys naming the routed-expert count: checkpoints use their family's own key, and
transformers 5 saves ``num_local_experts`` for all of them (an ``attribute_map`` alias)."""


def config_num_experts(config: dict[str, Any], origin: str = "config.json") -> int:
    """The number of routed experts from the first of `NUM_EXPERTS_KEYS` that ``config`` sets (0 if none)."""
    for key in NUM_EXPERTS_KEYS:
        if config.get(key) is not None:
            value = config[key]
            if not isinstance(value, int) or value < 0:
                raise ModelLoadError(f"{origin}: {key} must be a non-negative integer, got {value!r}")
            return value
    return 0


def router_spec_from_config(
    config: dict[str, Any],
    origin: str = "config.json",
    *,
    scoring: Scoring,
    normalize_top_k: bool,
    num_groups: int = 1,
    top_k_groups: int = 1,
    routed_scaling_factor: float = 1.0,
) -> RouterSpec:
    """A `RouterSpec` with the expert count (`config_num_experts`) and ``num_experts_per_tok`` read from
    ``config`` and the rest as given; impossible settings raise `ModelLoadError` naming ``origin``."""
    top_k = config.get("num_experts_per_tok")
    if not isinstance(top_k, int):
        raise ModelLoadError(f"{origin}: num_experts_per_tok must be an integer, got {top_k!r}")
    try:
        return RouterSpec(
            num_experts=config_num_experts(config, origin),
            top_k=top_k,
            scoring=scoring,
            normalize_top_k=normalize_top_k,
            num_groups=num_groups,
            top_k_groups=top_k_groups,
            routed_scaling_factor=routed_scaling_factor,
        )
    except ValueError as exc:
        raise ModelLoadError(f"{origin}: {exc}") from exc


@dataclass(frozen=True)
class ExpertNames:
    """Per-expert projection names under ``{prefix}{e}.``: ``gate`` (None for non-gated experts),
    ``up`` and ``down``. Hugging Face default: gate_proj / up_proj / down_proj; MiniMax: w1 / w3 / w2."""

    gate: str | None = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"


MINIMAX_EXPERT_NAMES = ExpertNames(gate="w1", up="w3", down="w2")
NON_GATED_EXPERT_NAMES = ExpertNames(gate=None)


def fused_expert_shapes(
    prefix: str, num_experts: int, intermediate: int, width: int, *, gated: bool = True
) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the fused expert tensors `read_experts` accepts under ``prefix``, for a
    loader's ``checkpoint_shapes``: ``gate_up_proj [E, 2I, W]`` (``up_proj [E, I, W]`` when not
    ``gated``) and ``down_proj [E, W, I]``, W being the width the experts read and write."""
    rows = 2 * intermediate if gated else intermediate
    return {
        prefix + ("gate_up_proj" if gated else "up_proj"): (num_experts, rows, width),
        prefix + "down_proj": (num_experts, width, intermediate),
    }


@overload
def read_experts(
    loader: ModelWeightLoader,
    prefix: str,
    num_experts: int,
    names: ExpertNames = ...,
    *,
    keep_quantized: Literal[False] = False,
) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def read_experts(
    loader: ModelWeightLoader,
    prefix: str,
    num_experts: int,
    names: ExpertNames = ...,
    *,
    keep_quantized: bool,
) -> tuple[np.ndarray | QuantizedWeight, np.ndarray | QuantizedWeight]: ...


def read_experts(
    loader: ModelWeightLoader,
    prefix: str,
    num_experts: int,
    names: ExpertNames = ExpertNames(),
    *,
    keep_quantized: bool = False,
) -> tuple[Any, Any]:
    """Host arrays ``(w_in[E, 2I or I, H], w_out[E, H, I])`` of the experts under ``prefix``
    (e.g. ``"model.layers.3.mlp.experts."``), per-expert or fused (see the module docstring).

    Gated experts (``names.gate`` set) give ``w_in`` = [gate rows | up rows] per expert. A missing
    tensor raises `ModelLoadError` naming it; fused tensors of the wrong shape too. Quantized experts
    come dequantized (float32), or with ``keep_quantized`` as host `QuantizedWeight` banks (for
    `RoutedExperts.upload`; a caller that rescales the banks must not ask for that).
    """
    read = loader.linear_weight if keep_quantized else loader.tensor
    gated = names.gate is not None
    fused_in = prefix + ("gate_up_proj" if gated else names.up)
    fused_out = prefix + "down_proj"
    if fused_in in loader.source and fused_out in loader.source:
        w_in, w_out = read(fused_in), read(fused_out)
        if w_in.ndim != 3 or w_in.shape[0] != num_experts or w_out.ndim != 3 or w_out.shape[0] != num_experts:
            raise ModelLoadError(
                f"{loader.origin}: fused expert tensors {fused_in!r} {w_in.shape} / {fused_out!r} {w_out.shape} "
                f"must be [num_experts={num_experts}, out, in]"
            )
        return w_in, w_out
    projections = [names.gate, names.up] if gated else [names.up]
    w_in = stack_experts(
        [concat_rows([read(f"{prefix}{e}.{p}.weight") for p in projections]) for e in range(num_experts)]
    )
    w_out = stack_experts([read(f"{prefix}{e}.{names.down}.weight") for e in range(num_experts)])
    return w_in, w_out


class Experts(Protocol):
    """Routed experts as `MoEFeedForward` calls them (the ``routed_experts`` layer type, or a plugin's
    replacement): ``experts(x[T, H], weights[T, k], ids[T, k]) -> [T, H]``, for each token the sum over
    its ``k`` chosen experts ``ids`` of ``weights`` times that expert's output; ``num_experts`` is E."""

    @property
    def num_experts(self) -> int: ...

    def __call__(self, x: Array, weights: Array, ids: Array) -> Array: ...


class RoutedExperts:
    """The routed experts of one layer, uploaded: ``w_in[E, 2I or I, H]``, ``w_out[E, H, I]`` and the
    activation (``"silu"`` / ``"gelu_tanh"`` gated, ``"relu2"`` non-gated). Called as
    ``experts(x[T, H], weights[T, k], ids[T, k]) -> [T, H]`` (`MoEOps.moe_experts`)."""

    def __init__(self, backend: Backend, w_in: Array, w_out: Array, activation: ExpertActivation) -> None:
        check_expert_shapes(tuple(w_in.shape), tuple(w_out.shape), activation)
        self.backend = backend
        self.w_in, self.w_out, self.activation = w_in, w_out, activation

    @classmethod
    def upload(
        cls,
        backend: Backend,
        w_in: np.ndarray | QuantizedWeight,
        w_out: np.ndarray | QuantizedWeight,
        activation: ExpertActivation,
    ) -> RoutedExperts:
        """Upload host arrays (e.g. from `read_experts`) as weights; `QuantizedWeight` banks through
        `Backend.upload_quantized` (kept quantized where the backend executes their format)."""
        check_expert_shapes(tuple(w_in.shape), tuple(w_out.shape), activation)

        def upload(bank: np.ndarray | QuantizedWeight) -> Array:
            if isinstance(bank, QuantizedWeight):
                return backend.upload_quantized(bank)
            return backend.from_numpy(bank, weight=True)

        return cls(backend, upload(w_in), upload(w_out), activation)

    @property
    def num_experts(self) -> int:
        """E, the number of routed experts."""
        return int(self.w_in.shape[0])

    @property
    def gated(self) -> bool:
        """Whether ``w_in`` holds gate and up rows (``[E, 2I, H]``) rather than up rows only."""
        return self.activation in GATED_ACTIVATIONS

    def __call__(self, x: Array, weights: Array, ids: Array) -> Array:
        return self.backend.ops(MoEOps).moe_experts(x, self.w_in, self.w_out, weights, ids, self.activation)


class MoEFeedForward:
    """A sparse MoE feed-forward block, called as ``moe(x[T, H], router_input=None) -> [T, H]``.

    ``router_weight[E, H]``: the router's linear layer (logits = ``router_input @ router_weight.T``).
    ``correction_bias[E]`` float32: selection-only bias (`RouterSpec` step 2), None for none.
    ``shared_expert``: a dense feed-forward applied to every token (e.g. a `SwiGLUMLP`; DeepSeek-V3's
    ``n_shared_experts`` experts are one MLP of ``n_shared_experts * moe_intermediate_size``), added to
    the routed output. ``shared_expert_gate[1, H]``: the shared output is first multiplied by
    ``sigmoid(x @ shared_expert_gate.T)`` (Qwen3-Next / Qwen3.5-MoE); needs ``shared_expert``.
    ``all_reduce``: a rank of a split model computes only its part of the block (its experts, and the
    shared expert on one rank), and the block's output is ``all_reduce(part)`` (`load_moe` sets it).
    """

    def __init__(
        self,
        backend: Backend,
        router_weight: Array,
        experts: Experts,
        spec: RouterSpec,
        *,
        correction_bias: Array | None = None,
        shared_expert: FeedForward | None = None,
        shared_expert_gate: Array | None = None,
        all_reduce: Callable[[Array], Array] | None = None,
    ) -> None:
        rows = spec.num_experts + (shared_expert is not None and shared_expert_gate is None)
        if tuple(router_weight.shape)[0] not in {spec.num_experts, rows} or experts.num_experts != spec.num_experts:
            raise ValueError(
                f"MoEFeedForward: router weight {tuple(router_weight.shape)} and {experts.num_experts} experts "
                f"must both match RouterSpec.num_experts ({spec.num_experts}; the router may hold the shared "
                "expert gate's row after the experts' rows)"
            )
        if correction_bias is not None and tuple(correction_bias.shape) != (spec.num_experts,):
            raise ValueError(
                f"MoEFeedForward: correction bias has shape {tuple(correction_bias.shape)}, "
                f"expected ({spec.num_experts},)"
            )
        if shared_expert_gate is not None and shared_expert is None:
            raise ValueError("MoEFeedForward: shared_expert_gate was given without a shared_expert")
        self.backend = backend
        self.router_weight = router_weight
        self.experts = experts
        self.spec = spec
        self.correction_bias = correction_bias
        self.shared_expert = shared_expert
        self.shared_expert_gate = shared_expert_gate
        self.all_reduce = all_reduce

    @property
    def gate_in_router(self) -> bool:
        """Whether ``router_weight`` holds the shared expert gate's row after the experts' rows (`load_moe` joins
        them where both are plain arrays: one product gives the router logits and the gate)."""
        return self.shared_expert_gate is None and self.router_weight.shape[0] == self.spec.num_experts + 1

    def route(self, router_input: Array) -> tuple[Array, Array]:
        """``(weights[T, k] float32, ids[T, k] int32)`` for ``router_input[T, H]``."""
        return self._route(router_input)[:2]

    def _route(self, router_input: Array) -> tuple[Array, Array, Array | None]:
        """`route`'s result and, with `gate_in_router`, the shared expert gate's logit ``[T, 1]``."""
        logits = self.backend.linear(router_input, self.router_weight)
        experts = self.spec.num_experts
        weights, ids = self.backend.ops(MoEOps).moe_route(logits[:, :experts], self.spec, self.correction_bias)
        return weights, ids, logits[:, experts:] if self.gate_in_router else None

    @property
    def shared_gate_weight(self) -> Array | None:
        """The shared expert gate's row: the router's last row with `gate_in_router`, else ``shared_expert_gate``."""
        return self.router_weight[self.spec.num_experts :] if self.gate_in_router else self.shared_expert_gate

    def __call__(self, x: Array, router_input: Array | None = None) -> Array:
        if self.gate_in_router and router_input is None:  # one product gives the logits and the gate
            weights, ids, gate_logit = self._route(x)
        else:  # through `route`, the block's hook for routing
            (weights, ids), gate_logit = self.route(x if router_input is None else router_input), None
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            gate = self.shared_gate_weight
            if gate_logit is None and gate is not None:  # the gate reads x, whatever the router reads
                gate_logit = self.backend.linear(x, gate)
            if gate_logit is not None:
                self.backend.sigmoid_gate_add(out, shared, gate_logit)
            else:
                out += shared
        return out if self.all_reduce is None else self.all_reduce(out)


def load_moe(
    loader: ModelWeightLoader,
    prefix: str,
    spec: RouterSpec,
    *,
    activation: ExpertActivation = "silu",
    names: ExpertNames = ExpertNames(),
    router: str = "gate.weight",
    experts: str = "experts.",
    correction_bias: str | None = None,
    shared_expert: FeedForward | None = None,
    shared_expert_gate: str | None = None,
) -> MoEFeedForward:
    """A `MoEFeedForward` from the checkpoint tensors under ``prefix`` (e.g. ``"model.layers.3.mlp."``):
    the router ``{prefix}{router}``, the experts under ``{prefix}{experts}`` (`read_experts`), the
    optional ``{prefix}{correction_bias}`` (kept in float32) and ``{prefix}{shared_expert_gate}``; expert
    tensors whose shapes do not fit ``activation`` raise `ModelLoadError` naming them.
    ``shared_expert`` is built by the caller (its form differs between families). The block and its
    experts are the loader's registered ``moe`` and ``routed_experts`` layer types. A split model's rank
    holds its experts' share (`atlas_core.model.layers.expert_parallel`) and the block all-reduces the
    ranks' parts; the shared expert is then the caller's unreduced tensor-parallel share
    (``gated_mlp(..., reduce=False)``), or, with tensor_parallel_size 1, whole and added by rank 0 alone."""
    split = loader.shard.is_split
    if split and not loader.shard.tensor_split and loader.shard.rank != 0:  # added once, by rank 0
        shared_expert, shared_expert_gate = None, None
    w_in: np.ndarray | QuantizedWeight
    w_out: np.ndarray | QuantizedWeight
    if split:
        held, w_in, w_out = read_expert_shard(loader, prefix + experts, spec.num_experts, names)
    else:
        w_in, w_out = read_experts(loader, prefix + experts, spec.num_experts, names, keep_quantized=True)
    try:
        routed: Experts = loader.layer_type("routed_experts").upload(loader.backend, w_in, w_out, activation)
    except ValueError as exc:
        raise ModelLoadError(f"{loader.origin}: {prefix}{experts.rstrip('.')}: {exc}") from exc
    if split:
        routed = ExpertShard(routed, held, spec.num_experts)
    router_rows = [loader.linear_weight(prefix + router)]
    gate_rows = None if shared_expert_gate is None else loader.linear_weight(prefix + shared_expert_gate)
    if gate_rows is not None and all(isinstance(w, np.ndarray) for w in (router_rows[0], gate_rows)):
        router_rows.append(gate_rows)  # one product gives the logits and the gate (MoEFeedForward.gate_in_router)
        gate_rows = None
    return loader.layer_type("moe")(
        loader.backend,
        loader.upload_arrays(*router_rows),
        routed,
        spec,
        correction_bias=None
        if correction_bias is None
        else loader.upload_float32(loader.tensor(prefix + correction_bias)),
        shared_expert=shared_expert,
        shared_expert_gate=None if gate_rows is None else loader.upload_arrays(gate_rows),
        all_reduce=loader.parallel.comm.all_reduce if split and loader.parallel is not None else None,
    )
