"""Host-side rearrangements of Qwen3-Next / Qwen3.5 projection weights into the layouts the core layers use
(a `ValueError` when shapes do not fit; the loader names the checkpoint and tensor)."""

from __future__ import annotations

import numpy as np

from atlas_core.model.layers.gated_delta_net import GatedDeltaNetShape


def split_gated_query(q_proj: np.ndarray, num_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Gated attention's ``q_proj`` (weight ``[Hq * 2D, H]`` or bias ``[Hq * 2D]``) holds, per head, D query
    rows then D gate rows; return ``(query rows [Hq * D, ...], gate rows [Hq * D, ...])``, head-major."""
    check_gated_query_rows(q_proj.shape[0], num_heads, head_dim)
    per_head = q_proj.reshape(num_heads, 2, head_dim, *q_proj.shape[1:])
    rest = q_proj.shape[1:]
    return per_head[:, 0].reshape(num_heads * head_dim, *rest), per_head[:, 1].reshape(num_heads * head_dim, *rest)


def check_gated_query_rows(rows: int, num_heads: int, head_dim: int) -> None:
    """`ValueError` unless a gated ``q_proj`` of ``rows`` rows holds ``num_heads`` heads of query and gate rows."""
    if rows != num_heads * 2 * head_dim:
        raise ValueError(
            f"gated attention q_proj has {rows} rows, expected num_attention_heads * 2 * head_dim = "
            f"{num_heads * 2 * head_dim}"
        )


def check_fused_gdn_rows(qkvz: tuple[int, ...], ba: tuple[int, ...], shape: GatedDeltaNetShape) -> None:
    """`ValueError` unless fused ``in_proj_qkvz`` / ``in_proj_ba`` of these shapes fit ``shape``'s key heads."""
    heads, ratio = shape.num_key_heads, shape.num_value_heads // shape.num_key_heads
    group = 2 * shape.key_head_dim + 2 * ratio * shape.value_head_dim
    if qkvz[0] != heads * group or ba[0] != heads * 2 * ratio:
        raise ValueError(
            f"in_proj_qkvz {qkvz} / in_proj_ba {ba} do not fit {heads} key heads of "
            f"{group} rows / {2 * ratio} rows (linear_* sizes in config.json)"
        )


def gdn_in_proj_from_fused(qkvz: np.ndarray, ba: np.ndarray, shape: GatedDeltaNetShape) -> np.ndarray:
    """Qwen3-Next's fused ``in_proj_qkvz`` / ``in_proj_ba`` -> the `GatedDeltaNetWeights.in_proj` rows.

    The fused weights are grouped by key head: for each of the Hk key heads, ``in_proj_qkvz`` holds its
    q rows (Dk), k rows (Dk), then the v rows and the z rows of its ``r = Hv / Hk`` value heads
    (r * Dv each); ``in_proj_ba`` holds its r b rows then its r a rows. Value head ``h * r + j`` belongs
    to key head h. The result lists all q rows, all k rows, all v, all z, all b, all a (Qwen3.5's split
    projections concatenated).
    """
    check_fused_gdn_rows(qkvz.shape, ba.shape, shape)
    heads, ratio = shape.num_key_heads, shape.num_value_heads // shape.num_key_heads
    group = 2 * shape.key_head_dim + 2 * ratio * shape.value_head_dim
    hidden = qkvz.shape[1]
    per_head = qkvz.reshape(heads, group, hidden)
    bounds = np.cumsum([shape.key_head_dim, shape.key_head_dim, ratio * shape.value_head_dim])
    q, k, v, z = np.split(per_head, bounds, axis=1)
    b, a = np.split(ba.reshape(heads, 2 * ratio, hidden), [ratio], axis=1)
    return np.concatenate([part.reshape(-1, hidden) for part in (q, k, v, z, b, a)])
