"""``example_llama``: a llama-shaped family, composed with this plugin's norm layer."""

from __future__ import annotations

from typing import Any, ClassVar

from atlas_core.model.loader import DenseDecoderLoader


class ExampleLlamaLoader(DenseDecoderLoader):
    """Llama weights and config keys as is; every RMSNorm is the ``example_rms_norm`` layer type.

    Layer types are looked up by registered name, so a family can swap in any installed layer.
    """

    layer_overrides: ClassVar[dict[str, str]] = {"rms_norm": "example_rms_norm"}

    def layer_type(self, name: str) -> Any:
        return super().layer_type(self.layer_overrides.get(name, name))
