"""Nemotron-H's building blocks: the one-mixer pre-norm block, and the MoE with latent projections."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.transformer import Mixer


class PreNormBlock:
    """``out = x + mixer(norm(x))``: one mixer per layer (Mamba-2, attention, MLP or MoE), the residual
    add fused into the next norm. Token mixers get ``(x, batch, kv)``; feed-forwards get ``x`` only."""

    def __init__(self, norm: RMSNorm, mixer: Mixer | Callable[[Array], Array], *, mixes_tokens: bool) -> None:
        self.norm, self.mixer, self.mixes_tokens = norm, mixer, mixes_tokens

    def __call__(self, hidden: Array, residual: Array | None, batch: ForwardBatch, kv: KVCache) -> tuple[Array, Array]:
        normed, residual = self.norm(hidden, residual)
        if self.mixes_tokens:  # the constructor's contract: a token mixer exactly when mixes_tokens
            out = cast(Mixer, self.mixer)(normed, batch, kv)
        else:
            out = cast(Callable[[Array], Array], self.mixer)(normed)
        return out, residual


class LatentMoE:
    """Nemotron-H MoE whose routed experts work in a smaller latent width: routed on ``x``, experts on
    ``fc1(x)`` (``[L, H]``), projected back by ``fc2`` (``[H, L]``), plus the shared expert on ``x``.
    ``moe`` holds the router, the latent-width experts, and no shared expert."""

    def __init__(
        self,
        backend: Backend,
        moe: MoEFeedForward,
        shared_expert: Callable[[Array], Array],
        fc1: Array,
        fc2: Array,
        fc1_bias: Array | None = None,
        fc2_bias: Array | None = None,
    ) -> None:
        if moe.shared_expert is not None:
            raise ValueError("LatentMoE: the shared expert runs at full width; pass it here, not inside moe")
        self.backend, self.moe, self.shared_expert = backend, moe, shared_expert
        self.fc1, self.fc2, self.fc1_bias, self.fc2_bias = fc1, fc2, fc1_bias, fc2_bias

    def __call__(self, x: Array) -> Array:
        backend = self.backend
        weights, ids = self.moe.route(x)
        routed = self.moe.experts(backend.linear(x, self.fc1, self.fc1_bias), weights, ids)
        if self.moe.all_reduce is not None:  # a split model's rank holds some experts: sum the ranks' parts
            routed = self.moe.all_reduce(routed)
        out = backend.linear(routed, self.fc2, self.fc2_bias)
        out += self.shared_expert(x)
        return out
