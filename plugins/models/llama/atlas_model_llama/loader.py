"""Config mapping for the llama-shaped families; the composition is core's `DenseDecoderLoader`.

Llama's ``attention_bias`` / ``mlp_bias`` keys are read by `DecoderSpec` itself.
"""

from __future__ import annotations

from atlas_core.errors import ModelLoadError
from atlas_core.model.loader import DenseDecoderLoader
from atlas_core.model.spec import DecoderSpec


class LlamaLoader(DenseDecoderLoader):
    """Llama 1-3 and SmolLM: the dense decoder as is."""


class MistralLoader(DenseDecoderLoader):
    """Mistral dense models (7B, Nemo, Small 3): llama without biases; sliding window unsupported."""

    def spec(self) -> DecoderSpec:
        window = self.source.config.get("sliding_window")
        max_len = int(self.source.config.get("max_position_embeddings", 0))
        if window is not None and int(window) < max_len:
            raise ModelLoadError(
                f"{self.origin}/config.json: sliding_window={window} is shorter than max_position_embeddings="
                f"{max_len}; sliding-window attention is not supported by atlas-model-llama yet"
            )
        return super().spec()


class Qwen2Loader(DenseDecoderLoader):
    """Qwen2 / Qwen2.5: biases on q/k/v only."""

    spec_overrides = {"qkv_bias": True, "o_bias": False}
