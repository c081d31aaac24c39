"""Mamba-2 mixer: in_proj -> causal conv1d over (x, B, C) -> selective scan (SSD) -> gated group RMSNorm -> out_proj.

The per-sequence state (the convolution window and the SSM state) lives in a
`atlas_core.model.recurrent_state.RecurrentState`, one row per state slot; the ops read and update
the rows of ``batch.state_slots`` in place (`atlas_core.backends.ops.mamba2`). A prefill may come in
chunks of any size and decode steps continue from where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.mamba2 import Mamba2Ops
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.recurrent_state import RecurrentState, StateArraySpec


@dataclass(frozen=True)
class Mamba2Shape:
    """The sizes and constants of one Mamba-2 mixer.

    ``num_heads`` Hm SSM heads of ``head_dim`` P values (the inner width I = Hm * P), ``n_groups`` G
    groups of B/C with ``state_size`` N each (Hm a multiple of G; the output norm also normalises
    over G groups of I / G channels), ``conv_kernel`` K taps, ``chunk_size`` of the chunked scan,
    ``norm_eps`` of the gated norm, and the time-step limits ``dt_min``/``dt_max``.
    """

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    chunk_size: int
    norm_eps: float
    dt_min: float = 0.0
    dt_max: float = float("inf")

    def __post_init__(self) -> None:
        if self.num_heads % self.n_groups:
            raise ValueError(f"Mamba-2: num_heads ({self.num_heads}) must be a multiple of n_groups ({self.n_groups})")
        if self.conv_kernel < 2:
            raise ValueError(f"Mamba-2: conv_kernel must be at least 2, got {self.conv_kernel}")
        if self.chunk_size < 1:
            raise ValueError(f"Mamba-2: chunk_size must be at least 1, got {self.chunk_size}")

    @property
    def inner_size(self) -> int:
        """I = Hm * P: the width of x, z and the scan output."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: x, B and C together (I + 2 G N)."""
        return self.inner_size + 2 * self.n_groups * self.state_size

    @property
    def in_proj_size(self) -> int:
        """Rows of in_proj: z (I), then x/B/C (conv_dim), then dt (Hm)."""
        return self.inner_size + self.conv_dim + self.num_heads

    def state_arrays(self) -> dict[str, StateArraySpec]:
        """The per-slot state: ``conv [conv_dim, K - 1]`` (activation dtype), ``ssm [Hm, P, N]`` (float32)."""
        return {
            "conv": StateArraySpec((self.conv_dim, self.conv_kernel - 1)),
            "ssm": StateArraySpec((self.num_heads, self.head_dim, self.state_size), np.dtype(np.float32)),
        }


@dataclass
class Mamba2Weights:
    """Uploaded weights: ``in_proj [I + conv_dim + Hm, H]``, ``conv [conv_dim, K]``, ``A [Hm]``
    (= -exp(A_log), float32), ``D``/``dt_bias [Hm]``, ``norm [I]``, ``out_proj [H, I]``; biases optional."""

    in_proj: Array
    conv: Array
    A: Array
    D: Array
    dt_bias: Array
    norm: Array
    out_proj: Array
    in_proj_bias: Array | None = None
    conv_bias: Array | None = None
    out_proj_bias: Array | None = None


class Mamba2Mixer:
    """The Mamba-2 token mixer of one layer, called as ``mixer(x [T, H], batch, kv) -> [T, H]``.

    Constructing it declares its state arrays in ``state`` (`Mamba2Shape.state_arrays`, before the
    engine allocates the state); its rows are ``state.arrays(layer_index)``. Pure decode batches take
    the single-step update (`mamba2_decode`), every other batch the chunked scan.
    """

    def __init__(
        self,
        backend: Backend,
        weights: Mamba2Weights,
        shape: Mamba2Shape,
        *,
        layer_index: int,
        state: RecurrentState,
    ) -> None:
        self.backend, self.weights, self.shape = backend, weights, shape
        self.layer_index, self.state = layer_index, state
        state.add_layer(layer_index, **shape.state_arrays())

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w, s = self.backend, self.weights, self.shape
        mamba = backend.ops(Mamba2Ops)
        tokens, inner, groups_width = x.shape[0], s.inner_size, s.n_groups * s.state_size
        arrays = self.state.arrays(self.layer_index)
        projected = backend.linear(x, w.in_proj, w.in_proj_bias)
        gate = projected[:, :inner]
        xbc = projected[:, inner : inner + s.conv_dim]
        dt = projected[:, inner + s.conv_dim :]
        starts, slots = batch.attention.query_start_loc, batch.state_slots
        checkpoints = batch.state_checkpoints
        xbc = mamba.causal_conv1d(xbc, w.conv, w.conv_bias, arrays["conv"], starts, slots, checkpoints=checkpoints)
        hidden = xbc[:, :inner].reshape(tokens, s.num_heads, s.head_dim)
        B = xbc[:, inner : inner + groups_width].reshape(tokens, s.n_groups, s.state_size)
        C = xbc[:, inner + groups_width :].reshape(tokens, s.n_groups, s.state_size)
        if batch.is_pure_decode:
            y = mamba.mamba2_decode(hidden, dt, w.A, B, C, w.D, w.dt_bias, arrays["ssm"], slots, s.dt_min, s.dt_max)
        else:
            y = mamba.mamba2_scan(
                hidden,
                dt,
                w.A,
                B,
                C,
                w.D,
                w.dt_bias,
                arrays["ssm"],
                starts,
                slots,
                s.chunk_size,
                s.dt_min,
                s.dt_max,
                checkpoints=checkpoints,
            )
        normed = mamba.gated_rms_norm(y.reshape(tokens, inner), gate, w.norm, s.norm_eps, inner // s.n_groups)
        return backend.linear(normed, w.out_proj, w.out_proj_bias)
