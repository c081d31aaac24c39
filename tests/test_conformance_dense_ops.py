"""Backend conformance: dense and logits ops (embedding, linear, rms_norm, silu_mul, gelu_tanh_mul,
gated_linear, rope, log_softmax, argmax) against float64 oracles.

Fixtures, tolerances, the seed handling (``ATLAS_CONFORMANCE_SEED``) and the oracles shared with
other modules are in ``atlas_core.testing`` (``conformance``, ``oracles``).
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.base import Array
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.oracles import MAX_POSITIONS, oracle_argmax, oracle_rope, rope_tables, tie_rows


# ---- float64 oracles -----------------------------------------------------------------------------
def oracle_rms_norm(
    x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    summed = x if residual is None else x + residual
    rms = np.sqrt(np.mean(summed * summed, axis=-1, keepdims=True) + eps)
    return summed / rms * weight, summed


def oracle_silu_mul(x: np.ndarray) -> np.ndarray:
    gate, up = np.split(x, 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up


def oracle_gelu_tanh_mul(x: np.ndarray) -> np.ndarray:
    gate, up = np.split(x, 2, axis=-1)
    return 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3))) * up


def oracle_log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


# ---- dense ops -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [1, 9])
def test_embedding(case: Case, tokens: int) -> None:
    vocab, hidden = 53, 24
    weight_dev, weight = case.upload(case.normal(vocab, hidden), weight=True)
    ids = case.rng.integers(0, vocab, size=tokens)
    if tokens > 2:
        ids[:3] = [0, vocab - 1, ids[-1]]  # both ends of the table and a repeat
    ids_dev, ids = case.upload(ids.astype(np.int32))
    with case.unchanged("embedding", weight=weight_dev, ids=ids_dev):
        case.assert_close(case.backend.embedding(weight_dev, ids_dev), weight[ids], "embedding")


@pytest.mark.parametrize(("tokens", "k", "n", "bias"), [(1, 33, 17, False), (7, 64, 24, True), (5, 1, 3, True)])
def test_linear(case: Case, tokens: int, k: int, n: int, bias: bool) -> None:
    x_dev, x = case.upload(case.normal(tokens, k))
    w_dev, w = case.upload(case.normal(n, k, scale=k**-0.5), weight=True)
    b_dev, b = case.upload(case.normal(n), weight=True) if bias else (None, np.zeros(n))
    inputs = {"x": x_dev, "weight": w_dev} | ({"bias": b_dev} if bias else {})
    with case.unchanged("linear", **inputs):
        case.check_out_variants(lambda out: case.backend.linear(x_dev, w_dev, b_dev, out=out), x @ w.T + b, "linear")


def upload_strided(case: Case, host: np.ndarray) -> tuple[Array, np.ndarray]:
    """``host`` ``[T, ...]`` as a strided view into the middle columns of a wider backend array, the
    way the attention layer slices q/k/v out of its fused QKV output."""
    tokens, width = host.shape[0], int(np.prod(host.shape[1:]))
    wider = case.normal(tokens, width + 16)
    wider[:, 8 : 8 + width] = host.reshape(tokens, width)
    view = case.backend.from_numpy(wider)[:, 8 : 8 + width].reshape(host.shape)
    return view, case.host(view)


RMS_NORM_LAYOUTS: dict[str, tuple[tuple[int, ...], bool]] = {  # layout -> (shape, strided view)
    "decode": ((1, 32), False),
    "odd": ((7, 33), False),
    "per_head": ((5, 3, 16), False),
    "per_head_view": ((5, 3, 16), True),  # q/k-norm on a slice of the fused QKV output
}


@pytest.mark.parametrize("layout", list(RMS_NORM_LAYOUTS))
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(case: Case, layout: str, with_residual: bool) -> None:
    shape, strided = RMS_NORM_LAYOUTS[layout]
    eps = float(case.rng.choice([1e-6, 1e-5]))
    x_host = case.normal(*shape, scale=3.0)
    residual_host = case.normal(*shape) if with_residual else None
    if shape[0] > 2:  # a row with mean square ~eps (where eps placement matters) and an all-zero row
        x_host[-2] *= np.sqrt(eps) / 3.0
        if residual_host is not None:
            residual_host[-2] *= np.sqrt(eps)
        x_host[-1] = 0.0 if residual_host is None else -residual_host[-1]
    x_dev, x = upload_strided(case, x_host) if strided else case.upload(x_host)
    w_dev, w = case.upload(case.normal(shape[-1]) + 1.0, weight=True)
    r_dev, r = case.upload(residual_host) if with_residual else (None, None)
    want_normed, want_summed = oracle_rms_norm(x, w, eps, r)
    inputs = {"x": x_dev, "weight": w_dev} | ({"residual": r_dev} if with_residual else {})
    with case.unchanged("rms_norm", **inputs):
        normed, summed = case.backend.rms_norm(x_dev, w_dev, eps, r_dev)
    case.assert_close(normed, want_normed, f"rms_norm normed output (eps={eps})")
    case.assert_close(summed, want_summed, "rms_norm residual-stream output (x + residual)")


@pytest.mark.parametrize(("tokens", "inner"), [(1, 13), (6, 32)])
def test_silu_mul(case: Case, tokens: int, inner: int) -> None:
    x_host = case.normal(tokens, 2 * inner, scale=2.0)
    x_host[0, :4] = [-100.0, -20.0, 20.0, 100.0]  # saturated gates must not produce NaN
    x_dev, x = case.upload(x_host)
    with case.unchanged("silu_mul", x=x_dev):
        case.check_out_variants(lambda out: case.backend.silu_mul(x_dev, out=out), oracle_silu_mul(x), "silu_mul")


@pytest.mark.parametrize(("tokens", "inner"), [(1, 13), (6, 32)])
def test_gelu_tanh_mul(case: Case, tokens: int, inner: int) -> None:
    x_host = case.normal(tokens, 2 * inner, scale=2.0)
    x_host[0, :4] = [-100.0, -20.0, 20.0, 100.0]  # saturated gates must not produce NaN
    x_dev, x = case.upload(x_host)
    with case.unchanged("gelu_tanh_mul", x=x_dev):
        case.check_out_variants(
            lambda out: case.backend.gelu_tanh_mul(x_dev, out=out), oracle_gelu_tanh_mul(x), "gelu_tanh_mul"
        )


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    ("tokens", "k", "inner", "bias"),
    [(1, 33, 13, False), (6, 64, 32, True), (300, 2056, 1480, True)],
    ids=["decode", "small", "prefill"],  # prefill: a product a device may fuse with its gate (off its tiles)
)
def test_gated_linear(case: Case, activation: str, tokens: int, k: int, inner: int, bias: bool) -> None:
    """The same bits as `linear` then the gated op, and ``act(gate) * up`` of that product against float64 (the
    product's own accuracy is `test_linear`'s)."""
    x_dev, _ = case.upload(case.normal(tokens, k))
    w_dev, _ = case.upload(case.normal(2 * inner, k, scale=2.0 * k**-0.5), weight=True)
    b_dev, _ = case.upload(case.normal(2 * inner), weight=True) if bias else (None, None)
    inputs = {"x": x_dev, "weight": w_dev} | ({"bias": b_dev} if bias else {})
    with case.unchanged("gated_linear", **inputs):
        fused = case.backend.gated_linear(x_dev, w_dev, activation, b_dev)
    product = case.backend.linear(x_dev, w_dev, b_dev)
    gated = case.backend.silu_mul(product) if activation == "silu" else case.backend.gelu_tanh_mul(product)
    np.testing.assert_array_equal(case.host(fused), case.host(gated))
    oracle = oracle_silu_mul if activation == "silu" else oracle_gelu_tanh_mul
    case.assert_close(fused, oracle(case.host(product)), "gated_linear")


def test_gated_linear_refuses_another_activation(case: Case) -> None:
    x_dev, _ = case.upload(case.normal(2, 8))
    w_dev, _ = case.upload(case.normal(6, 8), weight=True)
    with pytest.raises(ValueError, match="'relu2' is not one of silu, gelu_tanh"):
        case.backend.gated_linear(x_dev, w_dev, "relu2")


# ---- rotary embedding ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tokens", "q_heads", "kv_heads", "head_dim", "rotary_dim"),
    [(1, 4, 2, 16, 16), (7, 6, 2, 16, 8), (5, 3, 3, 12, 4), (4, 8, 2, 10, 6)],
    ids=["decode_full", "partial_half", "partial_third", "partial_odd_half"],
)
def test_rope(case: Case, tokens: int, q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int) -> None:
    positions = case.rng.integers(0, MAX_POSITIONS, size=tokens)
    positions[0] = MAX_POSITIONS - 1  # both ends of the tables
    if tokens > 1:
        positions[-1] = 0
    pos_dev, pos = case.upload(positions.astype(np.int32))
    tables = rope_tables(case, rotary_dim)
    q_dev, q = case.upload(case.normal(tokens, q_heads, head_dim))
    k_dev, k = case.upload(case.normal(tokens, kv_heads, head_dim))
    with case.unchanged("rope", positions=pos_dev, cos=tables.cos_dev, sin=tables.sin_dev):
        result = case.backend.rope(q_dev, k_dev, pos_dev, tables.cos_dev, tables.sin_dev)
    assert result is None, f"rope works in place and returns None {case.tag}"
    for name, got, before in (("q", q_dev, q), ("k", k_dev, k)):
        case.assert_close(got, oracle_rope(before, pos, tables.cos, tables.sin), f"rope {name}")
        case.assert_equal(case.host(got)[..., rotary_dim:], before[..., rotary_dim:], f"rope {name} tail dims")


# ---- logits ops ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("rows", "vocab", "offset"), [(1, 37, 0.0), (4, 1001, 300.0), (3, 40_003, -50.0)])
def test_log_softmax(case: Case, rows: int, vocab: int, offset: float) -> None:
    logits_dev, logits = case.upload(case.normal(rows, vocab, scale=3.0) + offset)
    with case.unchanged("log_softmax", logits=logits_dev):
        got = case.backend.log_softmax(logits_dev)
    case.assert_close(got, oracle_log_softmax(logits), "log_softmax", dtype=np.float32)
    values = case.host(got)
    lse = values.max(axis=-1) + np.log(np.exp(values - values.max(axis=-1, keepdims=True)).sum(axis=-1))
    case.assert_values(lse, np.zeros(rows), "log_softmax rows must logsumexp to 0")


@pytest.mark.parametrize(("rows", "vocab"), [(1, 37), (6, 257), (3, 40_003)])
def test_argmax(case: Case, rows: int, vocab: int) -> None:
    logits_host = np.concatenate([case.normal(rows, vocab), tie_rows(case, rows, vocab)])
    logits_dev, logits = case.upload(logits_host)
    with case.unchanged("argmax", logits=logits_dev):
        got = case.backend.argmax(logits_dev)
    case.assert_tokens(got, oracle_argmax(logits), "argmax (lowest index on ties)")
