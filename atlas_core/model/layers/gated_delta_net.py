"""Gated delta net (GDN) mixer: the linear-attention layers of Qwen3-Next and Qwen3.5.

    [q | k | v | z | b | a] = x @ in_proj.T                      one GEMM for every input projection
    q, k, v = silu(causal_conv1d([q | k | v]))                    short convolution, rolling state per sequence
    g, beta = -exp(A_log) * softplus(a + dt_bias), sigmoid(b)     per value head
    o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)        recurrent state [Hv, Dk, Dv] per sequence
    out = out_proj(rms_norm(o) * norm_weight * silu(z))           gated RMSNorm per value head

Both states (the convolution window and the delta-rule matrix) live in a `RecurrentState`, in the row
of each sequence's state slot; the layer declares them there when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.gated_delta import GatedDeltaOps, OutputNorm
from atlas_core.backends.ops.mamba2 import Mamba2Ops
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.recurrent_state import RecurrentState, StateArraySpec


@dataclass(frozen=True)
class GatedDeltaNetShape:
    """Head counts and sizes of one GDN layer (value heads a multiple of key heads)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    norm_eps: float

    def __post_init__(self) -> None:
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.num_key_heads})"
            )

    @property
    def key_dim(self) -> int:
        """Query / key features per token, ``Hk * Dk``."""
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        """Value (and output gate) features per token, ``Hv * Dv``."""
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def projection_rows(self) -> int:
        """Rows of the fused input projection: q, k, v, z, b, a."""
        return self.conv_dim + self.value_dim + 2 * self.num_value_heads

    def state_arrays(self) -> dict[str, StateArraySpec]:
        """``conv``: the last ``conv_kernel - 1`` inputs ``[C, K-1]`` (activation dtype); ``recurrent``:
        the delta-rule state ``[Hv, Dk, Dv]`` (float32)."""
        return {
            "conv": StateArraySpec((self.conv_dim, self.conv_kernel - 1)),
            "recurrent": StateArraySpec(
                (self.num_value_heads, self.key_head_dim, self.value_head_dim), np.dtype(np.float32)
            ),
        }


@dataclass
class GatedDeltaNetWeights:
    """``in_proj`` ``[projection_rows, H]``: rows q (all key heads), k, v (all value heads), z, b, a;
    ``conv`` ``[C, K]``; ``a_log``, ``dt_bias`` ``[Hv]`` float32; ``norm`` ``[Dv]`` (the gated norm's
    plain weight); ``out_proj`` ``[H, Hv * Dv]``."""

    in_proj: Array
    conv: Array
    a_log: Array
    dt_bias: Array
    norm: Array
    out_proj: Array


class GatedDeltaNet:
    """One GDN layer; a `Mixer` (``layer(x, batch, kv) -> out``) that reads and updates its rows of
    ``state`` for the batch's state slots (the KV cache is not used). Constructing it declares its
    state arrays in ``state`` (`GatedDeltaNetShape.state_arrays`)."""

    def __init__(
        self,
        backend: Backend,
        weights: GatedDeltaNetWeights,
        shape: GatedDeltaNetShape,
        *,
        layer_index: int,
        state: RecurrentState,
    ) -> None:
        self.backend, self.weights, self.shape = backend, weights, shape
        self.layer_index = layer_index
        self.state = state
        state.add_layer(layer_index, **shape.state_arrays())

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w, shape = self.backend, self.weights, self.shape
        gdn = backend.ops(GatedDeltaOps)
        tokens = x.shape[0]
        arrays = self.state.arrays(self.layer_index)
        starts = batch.attention.query_start_loc
        projected = backend.linear(x, w.in_proj)
        conv_end, z_end = shape.conv_dim, shape.conv_dim + shape.value_dim
        mixed = backend.ops(Mamba2Ops).causal_conv1d(
            projected[:, :conv_end],
            w.conv,
            None,
            arrays["conv"],
            starts,
            batch.state_slots,
            checkpoints=batch.state_checkpoints,
        )
        q = mixed[:, : shape.key_dim].reshape(tokens, shape.num_key_heads, shape.key_head_dim)
        k = mixed[:, shape.key_dim : 2 * shape.key_dim].reshape(tokens, shape.num_key_heads, shape.key_head_dim)
        v = mixed[:, 2 * shape.key_dim :].reshape(tokens, shape.num_value_heads, shape.value_head_dim)
        b = projected[:, z_end : z_end + shape.num_value_heads]
        a = projected[:, z_end + shape.num_value_heads :]
        z = projected[:, conv_end:z_end].reshape(tokens, shape.num_value_heads, shape.value_head_dim)
        normed = gdn.gated_delta_rule_with_gates(
            q,
            k,
            v,
            a,
            b,
            w.a_log,
            w.dt_bias,
            arrays["recurrent"],
            starts,
            batch.state_slots,
            scale=shape.key_head_dim**-0.5,
            norm=OutputNorm(z, w.norm, shape.norm_eps),
            checkpoints=batch.state_checkpoints,
        )
        return backend.linear(normed.reshape(tokens, shape.value_dim), w.out_proj)
