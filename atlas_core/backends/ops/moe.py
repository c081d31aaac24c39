"""Ops of the moe group with a host fallback (see `atlas_core.backends.ops`).

Mixture-of-Experts in two ops, covering the routers and experts of qwen3_moe, minimax_m2,
deepseek_v3, mistral4, gemma4, qwen3_next / qwen3_5_moe and nemotron_h:

  * `MoEOps.moe_route`: router logits -> top-k expert weights and ids (softmax or sigmoid scoring,
    selection-only correction bias, group-limited selection, renormalisation, routed scaling);
  * `MoEOps.moe_experts`: the weighted sum of each token's selected experts (gated SiLU, gated
    GELU-tanh, or non-gated squared ReLU).

A shared expert's gate is the core op `Backend.sigmoid_gate` (its reference is here).

The router's configuration is a frozen, hashable `RouterSpec` (a kernel may key compiled code on it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from atlas_core.backends.ops import OpGroup, on_host
from atlas_core.weights.quantized import QuantizedWeight, dequantize

if TYPE_CHECKING:
    from atlas_core.backends.base import Array

Scoring = Literal["softmax", "sigmoid"]
ExpertActivation = Literal["silu", "gelu_tanh", "relu2"]
GATED_ACTIVATIONS: frozenset[str] = frozenset({"silu", "gelu_tanh"})
"""Activations whose experts are gated: ``w_in`` holds [gate | up] rows, ``act(gate) * up``."""
EXPERT_ACTIVATIONS: frozenset[str] = GATED_ACTIVATIONS | {"relu2"}
NORMALIZE_EPSILON = 1e-20
"""Added to the sum of the selected weights before renormalising (as DeepSeek-V3 does; for
softmax or sigmoid scores the sum is far above it, so it changes nothing else)."""


@dataclass(frozen=True)
class RouterSpec:
    """How a router turns logits ``[T, E]`` into ``top_k`` weighted experts per token.

    Steps (float32), for each token:
      1. ``scores = softmax(logits)`` (over all E experts) or ``sigmoid(logits)`` per ``scoring``.
      2. ``choice = scores + correction_bias`` when a correction bias is given (DeepSeek-V3's
         ``e_score_correction_bias``): the bias decides WHICH experts are chosen, never their weight.
      3. With ``num_groups`` G > 1 the E experts form G consecutive groups of E / G; a group's score is
         the sum of its two largest ``choice`` values; only the ``top_k_groups`` best groups stay
         eligible (``n_group`` / ``topk_group`` of DeepSeek-V3, Mistral-4, Nemotron-H).
      4. ``ids``: the ``top_k`` eligible experts with the largest ``choice``, in descending order of
         ``choice`` (ties: lower id first).
      5. ``weights = scores[ids]`` (without the bias); with ``normalize_top_k`` divided by
         ``sum(weights) + 1e-20``; then multiplied by ``routed_scaling_factor``.

    Family settings: qwen3_moe / qwen3_next / qwen3_5_moe: softmax, normalize = ``norm_topk_prob``;
    gemma4: softmax, normalize (its router-input scale and per-expert scale are folded into the router
    and expert weights at load time, see `atlas_core.model.layers.moe`); minimax_m2: sigmoid + bias,
    normalize; deepseek_v3 / nemotron_h: sigmoid + bias, groups, ``norm_topk_prob``, routed scaling;
    mistral4: softmax, groups, ``norm_topk_prob``, routed scaling.
    """

    num_experts: int
    top_k: int
    scoring: Scoring = "softmax"
    normalize_top_k: bool = False
    num_groups: int = 1
    top_k_groups: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"RouterSpec.scoring must be 'softmax' or 'sigmoid', not {self.scoring!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"RouterSpec.top_k ({self.top_k}) must be between 1 and num_experts ({self.num_experts})")
        if self.num_groups < 1 or self.num_experts % self.num_groups:
            raise ValueError(f"RouterSpec.num_groups ({self.num_groups}) must divide num_experts ({self.num_experts})")
        if self.num_groups > 1:
            per_group = self.num_experts // self.num_groups
            if per_group < 2:
                raise ValueError(
                    f"RouterSpec: group-limited routing scores a group by its two best experts, so each of the "
                    f"{self.num_groups} groups needs at least 2 of the {self.num_experts} experts"
                )
            if not 1 <= self.top_k_groups <= self.num_groups:
                raise ValueError(
                    f"RouterSpec.top_k_groups ({self.top_k_groups}) must be between 1 and "
                    f"num_groups ({self.num_groups})"
                )
            if self.top_k > self.top_k_groups * per_group:
                raise ValueError(
                    f"RouterSpec.top_k ({self.top_k}) exceeds the {self.top_k_groups * per_group} experts in the "
                    f"top_k_groups ({self.top_k_groups}) eligible groups"
                )


# ---- NumPy references ----------------------------------------------------------------------------
def moe_route_reference(
    router_logits: np.ndarray, correction_bias: np.ndarray | None, *, spec: RouterSpec
) -> tuple[np.ndarray, np.ndarray]:
    """`MoEOps.moe_route` on host arrays: ``(weights[T, k] float32, ids[T, k] int32)``."""
    logits = np.asarray(router_logits, dtype=np.float32)
    tokens, num_experts = logits.shape
    if num_experts != spec.num_experts:
        raise ValueError(f"moe_route: router logits have {num_experts} experts, the RouterSpec says {spec.num_experts}")
    if spec.scoring == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = shifted / shifted.sum(axis=-1, keepdims=True)
    else:
        with np.errstate(over="ignore"):  # exp overflows to inf for logits below -88: sigmoid -> 0
            scores = 1.0 / (1.0 + np.exp(-logits))
    choice = scores if correction_bias is None else scores + np.asarray(correction_bias, dtype=np.float32)
    if spec.num_groups > 1:
        grouped = choice.reshape(tokens, spec.num_groups, -1)
        group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)
        best_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, : spec.top_k_groups]
        eligible = np.zeros(group_scores.shape, dtype=bool)
        np.put_along_axis(eligible, best_groups, True, axis=-1)
        choice = np.where(np.repeat(eligible, num_experts // spec.num_groups, axis=-1), choice, -np.inf)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, : spec.top_k]
    weights = np.take_along_axis(scores, ids, axis=-1)
    if spec.normalize_top_k:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + np.float32(NORMALIZE_EPSILON))
    if spec.routed_scaling_factor != 1.0:
        weights = weights * np.float32(spec.routed_scaling_factor)
    return weights.astype(np.float32), ids.astype(np.int32)


def expert_activation(hidden: np.ndarray, activation: str) -> np.ndarray:
    """The expert nonlinearity on ``hidden[N, 2I]`` ([gate | up], gated) or ``hidden[N, I]`` (relu2)."""
    from atlas_core.backends.numpy_backend import NumpyBackend  # imported here: that module imports this one

    if activation == "silu":
        return NumpyBackend.silu_mul(NumpyBackend(), hidden)
    if activation == "gelu_tanh":
        return NumpyBackend.gelu_tanh_mul(NumpyBackend(), hidden)
    if activation == "relu2":
        return np.square(np.maximum(hidden, 0.0))
    raise ValueError(f"unknown expert activation {activation!r}; expected one of {sorted(EXPERT_ACTIVATIONS)}")


def check_expert_shapes(w_in_shape: tuple[int, ...], w_out_shape: tuple[int, ...], activation: str) -> None:
    """Raise `ValueError` unless ``w_in[E, 2I or I, H]`` and ``w_out[E, H, I]`` fit ``activation``."""
    if activation not in EXPERT_ACTIVATIONS:
        raise ValueError(f"unknown expert activation {activation!r}; expected one of {sorted(EXPERT_ACTIVATIONS)}")
    if len(w_in_shape) != 3 or len(w_out_shape) != 3:
        raise ValueError(f"expert weights must be 3-D [E, out, in]; got w_in {w_in_shape}, w_out {w_out_shape}")
    experts, in_rows, hidden = w_in_shape
    intermediate = w_out_shape[2]
    want_rows = 2 * intermediate if activation in GATED_ACTIVATIONS else intermediate
    if w_out_shape[:2] != (experts, hidden) or in_rows != want_rows:
        kind = "gated: [E, 2I, H] (gate rows, then up)" if activation in GATED_ACTIVATIONS else "non-gated: [E, I, H]"
        raise ValueError(
            f"expert weights do not fit activation {activation!r} ({kind}, w_out [E, H, I]); "
            f"got w_in {w_in_shape}, w_out {w_out_shape}"
        )


def expert_matrix(bank: np.ndarray | QuantizedWeight, expert: int | np.integer) -> np.ndarray:
    """Matrix ``expert`` of a host expert bank ``[E, N, K]``; a quantized bank's is dequantized (only that
    expert's, on use)."""
    return dequantize(bank.expert(expert)) if isinstance(bank, QuantizedWeight) else bank[expert]


def moe_experts_reference(
    x: np.ndarray,
    w_in: np.ndarray | QuantizedWeight,
    w_out: np.ndarray | QuantizedWeight,
    weights: np.ndarray,
    ids: np.ndarray,
    *,
    activation: str,
) -> np.ndarray:
    """`MoEOps.moe_experts` on host arrays (or host `QuantizedWeight` banks, dequantized per active
    expert). The (token, slot) pairs are sorted by expert so each active expert runs as one GEMM over
    all of its tokens."""
    check_expert_shapes(w_in.shape, w_out.shape, activation)
    tokens, top_k = ids.shape
    flat_ids = ids.reshape(-1)
    order = np.argsort(flat_ids, kind="stable")
    bounds = np.searchsorted(flat_ids[order], np.arange(w_in.shape[0] + 1))
    flat_weights = weights.reshape(-1).astype(np.float32, copy=False)
    contributions = np.empty((tokens * top_k, x.shape[1]), dtype=np.float32)
    for expert in np.flatnonzero(np.diff(bounds)).tolist():
        pairs = order[bounds[expert] : bounds[expert + 1]]
        hidden = expert_activation(x[pairs // top_k] @ expert_matrix(w_in, expert).T, activation)
        contributions[pairs] = (hidden @ expert_matrix(w_out, expert).T) * flat_weights[pairs, None]
    return contributions.reshape(tokens, top_k, -1).sum(axis=1, dtype=np.float32)


def sigmoid_gate_reference(x: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """`Backend.sigmoid_gate` on host arrays."""
    with np.errstate(over="ignore"):
        return (x / (1.0 + np.exp(-gate.astype(np.float32)))).astype(np.float32)


# ---- the op group --------------------------------------------------------------------------------
class MoEOps(OpGroup):
    """The moe op group: every op defaults to its NumPy reference run on the host; a backend's
    native implementation (registered through ``register_op_implementations``) overrides them."""

    name = "moe"

    def moe_route(
        self, router_logits: Array, spec: RouterSpec, correction_bias: Array | None = None
    ) -> tuple[Array, Array]:
        """Top-k routing (see `RouterSpec` for the exact steps).

        ``router_logits[T, E]`` in any float dtype (math in float32); ``correction_bias[E]`` float32 or
        None. Returns ``(weights[T, top_k] float32, ids[T, top_k] int32)``, ids in descending order of
        their selection score. Not in place.
        """
        return on_host(self.backend, functools.partial(moe_route_reference, spec=spec), router_logits, correction_bias)

    def moe_experts(
        self,
        x: Array,
        w_in: Array,
        w_out: Array,
        weights: Array,
        ids: Array,
        activation: ExpertActivation,
    ) -> Array:
        """``out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` -> ``[T, H]`` activations.

        ``x[T, H]`` activations; ``w_in[E, 2I, H]`` (gated activations: the I gate rows, then the I up
        rows, i.e. Hugging Face's fused ``gate_up_proj``) or ``w_in[E, I, H]`` (``relu2``);
        ``w_out[E, H, I]``; either may be a `QuantizedWeight` bank of a format in the backend's
        ``quantized_formats`` (the experts are then those of its dequantized values); ``weights[T, k]``
        float32 and ``ids[T, k]`` int32 from `moe_route`.
        ``expert_e(v) = w_out[e] @ act(w_in[e] @ v)`` with ``act`` = ``silu(g) * u`` ("silu"),
        ``gelu_tanh(g) * u`` ("gelu_tanh", as in `Backend.gelu_tanh_mul`) or ``max(h, 0)**2``
        ("relu2", non-gated). The weight multiplies each expert's output, after ``w_out``. A token
        listing the same expert twice gets it twice. Not in place; accumulation in float32.
        """
        return on_host(
            self.backend, functools.partial(moe_experts_reference, activation=activation), x, w_in, w_out, weights, ids
        )
