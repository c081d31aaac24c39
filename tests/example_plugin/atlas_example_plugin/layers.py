"""``example_rms_norm``: core's RMSNorm layer, counting how often any instance runs."""

from __future__ import annotations

from typing import Any, ClassVar

from atlas_core.model.layers.norm import RMSNorm


class CountingRMSNorm(RMSNorm):
    """Same constructor and results as `RMSNorm`; ``CountingRMSNorm.calls`` counts calls of all instances."""

    calls: ClassVar[int] = 0

    def __call__(self, x: Any, residual: Any = None) -> tuple[Any, Any]:
        type(self).calls += 1
        return super().__call__(x, residual)
