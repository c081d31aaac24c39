"""Dense GeGLU feed-forward (Gemma): ``down(gelu_tanh(gate(x)) * up(x))``, gate and up fused in one GEMM."""

from __future__ import annotations

from atlas_core.backends.base import Array
from atlas_core.model.layers.mlp import SwiGLUMLP


class GeGLUMLP(SwiGLUMLP):
    """`SwiGLUMLP`'s weights and layout with the tanh-approximated GELU as the gate activation."""

    def __call__(self, x: Array) -> Array:
        backend = self.backend
        hidden = backend.gated_linear(x, self.gate_up, "gelu_tanh", self.gate_up_bias)
        return backend.linear(hidden, self.down, self.down_bias)
