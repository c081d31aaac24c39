"""Non-gated squared-ReLU feed-forward: ``down(relu(up(x)) ** 2)`` (Nemotron-H MLP layers and shared experts)."""

from __future__ import annotations

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.mamba2 import Mamba2Ops


class SquaredReLUMLP:
    """``up`` is ``[I, H]``, ``down`` is ``[H, I]``; biases optional. Called as ``mlp(x [T, H]) -> [T, H]``."""

    def __init__(
        self,
        backend: Backend,
        up: Array,
        down: Array,
        up_bias: Array | None = None,
        down_bias: Array | None = None,
    ) -> None:
        self.backend = backend
        self.up, self.down = up, down
        self.up_bias, self.down_bias = up_bias, down_bias

    def __call__(self, x: Array) -> Array:
        backend = self.backend
        hidden = backend.ops(Mamba2Ops).relu_squared(backend.linear(x, self.up, self.up_bias))
        return backend.linear(hidden, self.down, self.down_bias)
