"""Backend conformance: the Mixture-of-Experts ops (moe_route, moe_experts, sigmoid_gate, sigmoid_gate_add) and the
`MoEFeedForward` layer built on them, against float64 oracles written from ``docs/ops.md``.

Fixtures, tolerances and the seed handling (``ATLAS_CONFORMANCE_SEED``) are in
``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.base import Array
from atlas_core.backends.ops.moe import MoEOps, RouterSpec
from atlas_core.model.layers.moe import MoEFeedForward, RoutedExperts
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)

ROUTE_MARGIN = 1e-4
"""Every routing decision of a `moe_route` input is at least this far from a tie (in score units).
The oracle reads the logits back as the backend holds them, so only float32 score arithmetic can
move a decision: far less than this."""
LAYER_MARGIN = 0.02
"""The same for the layer test, whose router logits come out of `linear` in the activation dtype
(bf16 rounding moves a softmax score by well under this)."""


# ---- float64 oracles -----------------------------------------------------------------------------
def oracle_route(logits: np.ndarray, spec: RouterSpec, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, float]:
    """``(weights[T, k], ids[T, k], smallest decision margin)`` token by token."""
    tokens, experts = logits.shape
    weights = np.zeros((tokens, spec.top_k))
    ids = np.zeros((tokens, spec.top_k), dtype=np.int64)
    margin = np.inf
    per_group = experts // spec.num_groups
    for t in range(tokens):
        row = logits[t]
        if spec.scoring == "softmax":
            scores = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        else:
            scores = 1.0 / (1.0 + np.exp(-row))
        choice = scores + (bias if bias is not None else 0.0)
        eligible = list(range(experts))
        if spec.num_groups > 1:
            group_scores = [
                sum(sorted(choice[g * per_group : (g + 1) * per_group])[-2:]) for g in range(spec.num_groups)
            ]
            ranked_groups = sorted(range(spec.num_groups), key=lambda g: -group_scores[g])
            if spec.top_k_groups < spec.num_groups:
                margin = min(
                    margin,
                    group_scores[ranked_groups[spec.top_k_groups - 1]] - group_scores[ranked_groups[spec.top_k_groups]],
                )
            kept = set(ranked_groups[: spec.top_k_groups])
            eligible = [e for e in eligible if e // per_group in kept]
        ranked = sorted(eligible, key=lambda e: -choice[e])
        for j in range(min(spec.top_k, len(ranked) - 1)):
            margin = min(margin, choice[ranked[j]] - choice[ranked[j + 1]])
        chosen = ranked[: spec.top_k]
        w = np.array([scores[e] for e in chosen])
        if spec.normalize_top_k:
            w = w / w.sum()
        weights[t], ids[t] = w * spec.routed_scaling_factor, chosen
    return weights, ids, float(margin)


def oracle_experts(
    x: np.ndarray, w_in: np.ndarray, w_out: np.ndarray, weights: np.ndarray, ids: np.ndarray, activation: str
) -> np.ndarray:
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = w_in[e] @ x[t]
            if activation == "relu2":
                a = np.maximum(h, 0.0) ** 2
            else:
                gate, up = np.split(h, 2)
                if activation == "silu":
                    a = gate / (1.0 + np.exp(-gate)) * up
                else:
                    a = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3))) * up
            out[t] += weights[t, j] * (w_out[e] @ a)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# ---- inputs --------------------------------------------------------------------------------------
def router_inputs(case: Case, spec: RouterSpec, tokens: int, with_bias: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Random logits (and a bias) whose routing decisions are all clear of ties (`ROUTE_MARGIN`)."""
    for _ in range(1000):
        logits = case.normal(tokens, spec.num_experts, scale=2.0)
        bias = case.normal(spec.num_experts, scale=0.3) if with_bias else None
        held_logits = case.host(case.backend.from_numpy(logits))
        if oracle_route(held_logits, spec, bias)[2] >= ROUTE_MARGIN:
            return logits, bias
    raise AssertionError(f"could not draw router logits clear of ties {case.tag}")


# specs modelled on the families: qwen3_moe (norm_topk_prob off / on), minimax_m2, deepseek_v3 /
# nemotron_h (sigmoid, groups, scaling), mistral4 (softmax, groups, scaling)
ROUTER_CASES = {
    "softmax": (RouterSpec(8, 2), False),
    "softmax-normalized": (RouterSpec(8, 2, normalize_top_k=True), False),
    "sigmoid-bias-normalized": (RouterSpec(8, 2, scoring="sigmoid", normalize_top_k=True), True),
    "sigmoid-bias-groups-scaled": (
        RouterSpec(
            16, 4, scoring="sigmoid", normalize_top_k=True, num_groups=4, top_k_groups=2, routed_scaling_factor=2.5
        ),
        True,
    ),
    "softmax-groups-scaled": (
        RouterSpec(12, 3, normalize_top_k=True, num_groups=3, top_k_groups=2, routed_scaling_factor=1.5),
        False,
    ),
}


# ---- moe_route -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [1, 13])
@pytest.mark.parametrize("name", list(ROUTER_CASES))
def test_moe_route(case: Case, name: str, tokens: int) -> None:
    spec, with_bias = ROUTER_CASES[name]
    logits, bias = router_inputs(case, spec, tokens, with_bias)
    logits_dev, logits_held = case.upload(logits)
    bias_dev = None if bias is None else case.backend.from_numpy(bias, dtype=np.dtype(np.float32))
    want_weights, want_ids, _ = oracle_route(logits_held, spec, bias)
    with case.unchanged("moe_route", logits=logits_dev):
        weights, ids = case.backend.ops(MoEOps).moe_route(logits_dev, spec, bias_dev)
    case.assert_tokens(ids, want_ids, f"moe_route[{name}] ids")
    case.assert_close(weights, want_weights, f"moe_route[{name}] weights", dtype=np.dtype(np.float32))


def test_moe_route_bias_changes_selection_not_weights(case: Case) -> None:
    """A large bias on one expert forces it into every token's top-k with its unbiased score as weight."""
    spec = RouterSpec(8, 2, scoring="sigmoid")
    logits_dev, logits = case.upload(case.normal(5, 8))
    bias = np.zeros(8, dtype=np.float32)
    bias[3] = 10.0
    weights, ids = case.backend.ops(MoEOps).moe_route(
        logits_dev, spec, case.backend.from_numpy(bias, dtype=np.dtype(np.float32))
    )
    ids, weights = case.raw(ids), case.host(weights)
    case.assert_equal(ids[:, 0].astype(np.int64), np.full(5, 3), "moe_route: the biased expert ranks first")
    case.assert_values(
        weights[:, 0], sigmoid(logits[:, 3]), "moe_route: the biased expert's weight is its sigmoid score"
    )


# ---- moe_experts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [1, 17])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu2"])
def test_moe_experts(case: Case, activation: str, tokens: int) -> None:
    experts, top_k, hidden, inter = 8, 3, 24, 16
    in_rows = inter if activation == "relu2" else 2 * inter
    x_dev, x = case.upload(case.normal(tokens, hidden))
    w_in_dev, w_in = case.upload(case.normal(experts, in_rows, hidden, scale=hidden**-0.5), weight=True)
    w_out_dev, w_out = case.upload(case.normal(experts, hidden, inter, scale=inter**-0.5), weight=True)
    ids = np.stack(
        [case.rng.choice(experts - 2, size=top_k, replace=False) for _ in range(tokens)]
    )  # experts 6, 7 idle
    if tokens > 1:
        ids[0] = [1, 1, 4]  # the same expert twice counts twice
    ids_dev, ids = case.upload(ids.astype(np.int32))
    weights_dev = case.backend.from_numpy(case.rng.uniform(0.1, 1.0, (tokens, top_k)), dtype=np.dtype(np.float32))
    weights = case.host(weights_dev)
    inputs = {"x": x_dev, "w_in": w_in_dev, "w_out": w_out_dev, "weights": weights_dev, "ids": ids_dev}
    with case.unchanged("moe_experts", **inputs):
        got = case.backend.ops(MoEOps).moe_experts(x_dev, w_in_dev, w_out_dev, weights_dev, ids_dev, activation)
    case.assert_close(got, oracle_experts(x, w_in, w_out, weights, ids, activation), f"moe_experts[{activation}]")


def test_moe_experts_rejects_weights_that_do_not_fit_the_activation(case: Case) -> None:
    x = case.backend.from_numpy(case.normal(2, 8))
    w_in = case.backend.from_numpy(case.normal(4, 6, 8), weight=True)  # I = 6 rows: non-gated
    w_out = case.backend.from_numpy(case.normal(4, 8, 6), weight=True)
    ids = case.backend.from_numpy(np.zeros((2, 1), dtype=np.int32))
    weights = case.backend.from_numpy(np.ones((2, 1), dtype=np.float32))
    with pytest.raises(ValueError, match="gated"):
        case.backend.ops(MoEOps).moe_experts(x, w_in, w_out, weights, ids, "silu")
    with pytest.raises(ValueError, match="unknown expert activation"):
        case.backend.ops(MoEOps).moe_experts(x, w_in, w_out, weights, ids, "gelu")


# ---- sigmoid_gate --------------------------------------------------------------------------------
@pytest.mark.parametrize("gate_width", [1, 10])
def test_sigmoid_gate(case: Case, gate_width: int) -> None:
    x_dev, x = case.upload(case.normal(6, 10))
    gate_dev, gate = case.upload(case.normal(6, gate_width, scale=3.0))
    with case.unchanged("sigmoid_gate", x=x_dev, gate=gate_dev):
        case.assert_close(case.backend.sigmoid_gate(x_dev, gate_dev), x * sigmoid(gate), "sigmoid_gate")


@pytest.mark.parametrize("gate_width", [1, 10])
def test_sigmoid_gate_add(case: Case, gate_width: int) -> None:
    """``out += x * sigmoid(gate)`` in place, ``x`` a column slice (as a shared expert's output may be)."""
    wide_dev, wide = case.upload(case.normal(6, 14))
    gate_dev, gate = case.upload(case.normal(6, gate_width, scale=3.0))
    out_dev, out = case.upload(case.normal(6, 10))
    x_dev, x = wide_dev[:, 2:12], wide[:, 2:12]
    with case.unchanged("sigmoid_gate_add", x=x_dev, gate=gate_dev):
        got = case.backend.sigmoid_gate_add(out_dev, x_dev, gate_dev)
    assert got is out_dev
    case.assert_close(out_dev, out + x * sigmoid(gate), "sigmoid_gate_add")


# ---- the layer -----------------------------------------------------------------------------------
@pytest.mark.parametrize("separate_input", [True, False], ids=["router_input", "x"])
@pytest.mark.parametrize("joined", [False, True], ids=["gate_apart", "gate_in_router"])
def test_moe_feed_forward_with_gated_shared_expert(case: Case, joined: bool, separate_input: bool) -> None:
    """``experts(x; route(router_input)) + sigmoid(x @ g.T) * shared(x)``: the Qwen3-Next block shape, routed on
    x or on a separate input as Gemma-4 does, with the gate's row apart or after the router's rows (as `load_moe`
    joins them: `MoEFeedForward.gate_in_router`)."""
    tokens, hidden, inter, spec = 9, 16, 8, RouterSpec(8, 2, normalize_top_k=True)
    # the logits' spread keeps the expert choice clear of ties: a router input of scale 3, or, where the router
    # reads x itself (which then also feeds the experts, best kept at scale 1 in bf16), router rows 3 times larger
    router_scale, input_scale = (1.0, 3.0) if separate_input else (3.0, 1.0)
    router_dev, router_weight = case.upload(case.normal(8, hidden, scale=router_scale * hidden**-0.5), weight=True)
    gate_dev, gate = case.upload(case.normal(1, hidden, scale=hidden**-0.5), weight=True)
    for _ in range(1000):  # a router input whose expert choice is clear of ties
        router_input_dev, router_input = case.upload(case.normal(tokens, hidden, scale=input_scale))
        weights, ids, margin = oracle_route(router_input @ router_weight.T, spec, None)
        if margin >= LAYER_MARGIN:
            break
    else:
        raise AssertionError(f"could not draw a router input clear of ties {case.tag}")
    x_dev, x = case.upload(case.normal(tokens, hidden)) if separate_input else (router_input_dev, router_input)
    w_in_dev, w_in = case.upload(case.normal(8, 2 * inter, hidden, scale=hidden**-0.5), weight=True)
    w_out_dev, w_out = case.upload(case.normal(8, hidden, inter, scale=inter**-0.5), weight=True)
    shared_scale = 0.5
    scaling_dev, _ = case.upload(np.eye(hidden, dtype=np.float32) * shared_scale, weight=True)
    if joined:  # the rows as uploaded already (bf16 on the cuda backend), so the second upload rounds nothing
        router_dev, _ = case.upload(np.concatenate([router_weight, gate]).astype(np.float32), weight=True)
        gate_dev = None

    def shared_expert(v: Array) -> Array:  # a stand-in shared expert that stays in the backend's dtype
        return case.backend.linear(v, scaling_dev)

    moe = MoEFeedForward(
        case.backend,
        router_dev,
        RoutedExperts(case.backend, w_in_dev, w_out_dev, "silu"),
        spec,
        shared_expert=shared_expert,
        shared_expert_gate=gate_dev,
    )
    assert moe.gate_in_router == joined
    want = oracle_experts(x, w_in, w_out, weights, ids, "silu") + sigmoid(x @ gate.T) * x * shared_scale
    got = moe(x_dev, router_input=router_input_dev if separate_input else None)
    case.assert_close(got, want, "MoEFeedForward")


def test_router_spec_rejects_impossible_settings() -> None:
    with pytest.raises(ValueError, match="top_k"):
        RouterSpec(4, 5)
    with pytest.raises(ValueError, match="num_groups"):
        RouterSpec(8, 2, num_groups=3)
    with pytest.raises(ValueError, match="two best experts"):
        RouterSpec(4, 2, num_groups=4, top_k_groups=2)
    with pytest.raises(ValueError, match="eligible groups"):
        RouterSpec(8, 5, num_groups=4, top_k_groups=2)
    with pytest.raises(ValueError, match="scoring"):
        RouterSpec(8, 2, scoring="relu")  # type: ignore[arg-type]
