"""RMSNorm with the residual add fused in."""

from __future__ import annotations

from atlas_core.backends.base import Array, Backend


class RMSNorm:
    """``y = x / rms(x) * weight``; with ``residual`` it first adds it and also returns the sum."""

    def __init__(self, backend: Backend, weight: Array, eps: float) -> None:
        self.backend = backend
        self.weight = weight
        self.eps = eps

    def __call__(self, x: Array, residual: Array | None = None) -> tuple[Array, Array]:
        return self.backend.rms_norm(x, self.weight, self.eps, residual)
