"""Backend conformance: the ``vision`` op group (layer_norm, gelu, segment_attention) that vision towers
run on, against float64 oracles written from the group's docstrings.

Fixtures, tolerances and the seed handling (``ATLAS_CONFORMANCE_SEED``) are in
``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from atlas_core.backends.ops.vision import VisionOps
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)


def vision(case: Case) -> VisionOps:
    """The backend's implementation of the vision op group (native where one is registered)."""
    return case.backend.ops(VisionOps)


@pytest.mark.parametrize("shape", [(1, 32), (7, 48), (3, 5, 16)], ids=["row", "rows", "heads"])
def test_layer_norm(case: Case, shape: tuple[int, ...]) -> None:
    channels = shape[-1]
    x_dev, x = case.upload(case.normal(*shape, scale=3.0) + 2.0)
    w_dev, w = case.upload(case.normal(channels), weight=True)
    b_dev, b = case.upload(case.normal(channels), weight=True)
    eps = 1e-6
    with case.unchanged("layer_norm", x=x_dev, weight=w_dev, bias=b_dev):
        got = vision(case).layer_norm(x_dev, w_dev, b_dev, eps)
    centred = x - x.mean(axis=-1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps) * w + b
    case.assert_close(got, want, f"layer_norm {shape}")


@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_gelu(case: Case, approximate: bool) -> None:
    x_host = case.normal(6, 40, scale=3.0)
    x_host.reshape(-1)[:4] = [0.0, 12.0, -12.0, -0.5]
    x_dev, x = case.upload(x_host)
    with case.unchanged("gelu", x=x_dev):
        got = vision(case).gelu(x_dev, approximate)
    if approximate:
        want = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    else:
        want = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    case.assert_close(got, want, f"gelu (approximate={approximate})")


@pytest.mark.parametrize("segments", [[5], [3, 9, 1], [16, 4]], ids=["one", "three", "long"])
def test_segment_attention(case: Case, segments: list[int]) -> None:
    """Full attention within each segment (an image's patches), nothing across segments."""
    heads, head_dim = 3, 8
    cu_seqlens = np.concatenate([[0], np.cumsum(segments)]).astype(np.int64)
    total = int(cu_seqlens[-1])
    q_dev, q = case.upload(case.normal(total, heads, head_dim))
    k_dev, k = case.upload(case.normal(total, heads, head_dim))
    v_dev, v = case.upload(case.normal(total, heads, head_dim))
    scale = head_dim**-0.5
    with case.unchanged("segment_attention", q=q_dev, k=k_dev, v=v_dev):
        got = vision(case).segment_attention(q_dev, k_dev, v_dev, cu_seqlens, scale)
    want = np.empty((total, heads, head_dim))
    for start, stop in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        scores = np.einsum("qhd,khd->hqk", q[start:stop], k[start:stop]) * scale
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        want[start:stop] = np.einsum("hqk,khd->qhd", weights, v[start:stop])
    case.assert_close(got, want, f"segment_attention (segments {segments})")
