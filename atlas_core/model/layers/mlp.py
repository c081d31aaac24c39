"""Dense SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` with gate and up fused in one GEMM."""

from __future__ import annotations

from atlas_core.backends.base import Array, Backend


class SwiGLUMLP:
    """``gate_up`` is ``[2I, H]`` (gate rows first), ``down`` is ``[H, I]``; biases optional."""

    def __init__(
        self,
        backend: Backend,
        gate_up: Array,
        down: Array,
        gate_up_bias: Array | None = None,
        down_bias: Array | None = None,
    ) -> None:
        self.backend = backend
        self.gate_up, self.down = gate_up, down
        self.gate_up_bias, self.down_bias = gate_up_bias, down_bias

    def __call__(self, x: Array) -> Array:
        backend = self.backend
        hidden = backend.gated_linear(x, self.gate_up, "silu", self.gate_up_bias)
        return backend.linear(hidden, self.down, self.down_bias)
