"""Per-layer inputs (Gemma 4's per-layer embeddings): a small vector per token for every decoder layer,
built once per forward from the token ids and the input embeddings, and gated into each layer's output."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.model.layers.norm import RMSNorm
from atlas_model_gemma.ops import GemmaOps


def in_activation_dtype(backend: Backend, value: float) -> float:
    """``value`` rounded to the backend's activation dtype (Gemma scales embeddings by constants
    rounded this way: sqrt(3072) is 55.4256 in float32 but 55.5 in bfloat16)."""
    return float(np.asarray(value, dtype=np.float32).astype(backend.activation_dtype))


class PerLayerInputs:
    """``inputs(ids[T], embeds[T, H]) -> [T, L, P]``::

        token   = table[ids] * sqrt(P)                                   # [T, L * P] -> [T, L, P]
        context = norm((embeds @ projection.T) * H**-0.5)                # [T, L, P], norm over P
        out     = (context + token) * 2**-0.5

    ``table`` is ``[V', L * P]``, ``projection`` ``[L * P, H]``, ``norm`` an RMSNorm of width P.
    """

    gathered_weights: ClassVar[tuple[str, ...]] = ("table",)
    """A step gathers a few rows of ``table`` (like the embedding table's): what benchmarks count
    as read (`atlas_core.bench.roofline.GATHERED_WEIGHTS`)."""

    def __init__(
        self,
        backend: Backend,
        table: Array,
        projection: Array,
        norm: RMSNorm,
        *,
        num_layers: int,
        size: int,
    ) -> None:
        if tuple(table.shape)[1:] != (num_layers * size,) or tuple(projection.shape)[:1] != (num_layers * size,):
            raise ValueError(
                f"per-layer inputs: table {tuple(table.shape)} and projection {tuple(projection.shape)} must have "
                f"num_layers * size = {num_layers} * {size} rows/columns"
            )
        self.backend = backend
        self.table, self.projection, self.norm = table, projection, norm
        self.num_layers, self.size = num_layers, size
        self.hidden_size = int(projection.shape[1])

    def __call__(self, ids: Array, embeds: Array) -> Array:
        backend = self.backend
        tokens = embeds.shape[0]
        shape = (tokens, self.num_layers, self.size)
        token = backend.ops(GemmaOps).scale(
            backend.embedding(self.table, ids), in_activation_dtype(backend, self.size**0.5)
        )
        context = backend.ops(GemmaOps).scale(backend.linear(embeds, self.projection), self.hidden_size**-0.5)
        context = self.norm(context.reshape(shape))[0]
        return backend.ops(GemmaOps).add_scaled(context, token.reshape(shape), 2.0**-0.5)


class PerLayerInputGate:
    """A decoder layer's use of its per-layer input ``p[T, P]``:
    ``norm(projection @ (gelu_tanh(gate @ h) * p))`` -> ``[T, H]``, added to the layer's output ``h``
    by the caller. ``gate`` is ``[P, H]``, ``projection`` ``[H, P]``, ``norm`` an RMSNorm of width H."""

    def __init__(self, backend: Backend, gate: Array, projection: Array, norm: RMSNorm) -> None:
        self.backend = backend
        self.gate, self.projection, self.norm = gate, projection, norm

    def __call__(self, hidden: Array, per_layer_input: Array) -> Array:
        backend = self.backend
        gated = backend.ops(GemmaOps).gelu_tanh_gate(backend.linear(hidden, self.gate), per_layer_input)
        return self.norm(backend.linear(gated, self.projection))[0]
