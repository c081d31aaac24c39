"""``qwen3_vl`` and ``qwen3_vl_moe``: Qwen3-VL checkpoints. The text stack (``model.language_model.*``,
settings under ``text_config``) is core's dense decoder with Qwen3's q/k norms (and, for Qwen3-VL-MoE,
MoE feed-forward layers), read through `TextStackSource`; the vision tower (``model.visual.*``,
``vision_config``) is built from this plugin's registered layers and attached as the model's
`atlas_core.model.vision.VisionModel` (`atlas_model_qwen3_vl.attach`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.moe import load_moe, router_spec_from_config
from atlas_core.model.loader import DenseDecoderLoader, ModelWeightLoader
from atlas_core.model.sparse_layers import qwen_sparse_layer, with_sparse_mlp_shapes
from atlas_core.model.spec import DecoderSpec
from atlas_core.model.transformer import TransformerModel
from atlas_core.weights.quantized import QuantizedWeight
from atlas_core.weights.source import WeightSource, quantized_tensor, tensor_part, tensor_shape
from atlas_model_qwen3_vl.attach import attach_vision, tower_shapes

TEXT_PREFIX = "model.language_model."


FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def text_config(config: dict[str, Any], origin: str = "") -> dict[str, Any]:
    """A vision-language ``config``'s ``text_config``, with its top-level ``tie_word_embeddings`` and
    ``quantization_config``."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ModelLoadError(f"{origin}/config.json: a {config.get('model_type')!r} config needs text_config")
    merged: dict[str, Any] = {**text, "tie_word_embeddings": config.get("tie_word_embeddings", False)}
    if "quantization_config" in config:
        merged["quantization_config"] = config["quantization_config"]
    return merged


class TextStackSource:
    """A vision-language checkpoint's text stack seen as a text-only checkpoint: ``config`` is its
    ``text_config`` (with the top-level ``tie_word_embeddings`` and ``quantization_config``), and text names
    ``model.X`` read ``model.language_model.X``; other names (``lm_head.weight``) pass through.

    Fused experts come as core's MoE loader reads them (``gate_up_proj [E, 2I, H]``, ``down_proj
    [E, H, I]``): published Qwen3-VL-MoE checkpoints store them transposed (``[E, H, 2I]``, ``[E, I, H]``),
    so a stored tensor whose shape is not the expected one is transposed, as transformers does on load.
    """

    def __init__(self, source: WeightSource, origin: str) -> None:
        self.source = source
        self.config = text_config(source.config, origin)

    @staticmethod
    def stored(name: str) -> str:
        return TEXT_PREFIX + name.removeprefix("model.") if name.startswith("model.") else name

    def names(self) -> Iterator[str]:
        for name in self.source.names():
            if name.startswith(TEXT_PREFIX):
                yield "model." + name.removeprefix(TEXT_PREFIX)
            elif not name.startswith("model."):
                yield name

    def __contains__(self, name: str) -> bool:
        return self.stored(name) in self.source

    def transposed(self, name: str) -> bool:
        """Whether fused-expert tensor ``name`` is stored transposed (see the class docstring)."""
        if not name.endswith(FUSED_EXPERTS):
            return False
        stored = tensor_shape(self.source, self.stored(name))
        hidden, inter = int(self.config.get("hidden_size", 0)), int(self.config.get("moe_intermediate_size", 0))
        expected = (2 * inter, hidden) if name.endswith("gate_up_proj") else (hidden, inter)
        return len(stored) == 3 and stored[1:] != expected and stored[1:] == expected[::-1]

    def get(self, name: str) -> np.ndarray:
        tensor = self.source.get(self.stored(name))
        return np.ascontiguousarray(tensor.transpose(0, 2, 1)) if self.transposed(name) else tensor

    def shape(self, name: str) -> tuple[int, ...]:
        shape = tensor_shape(self.source, self.stored(name))
        return (shape[0], shape[2], shape[1]) if self.transposed(name) else shape

    def get_part(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        if self.transposed(name):
            return np.ascontiguousarray(self.get(name)[index])
        return tensor_part(self.source, self.stored(name), index)

    def get_quantized(self, name: str) -> QuantizedWeight | None:
        """The stored quantized weight; None for transposed experts (`get` dequantizes and transposes them)."""
        return None if self.transposed(name) else quantized_tensor(self.source, self.stored(name))


class Qwen3VLTextLoader(DenseDecoderLoader):
    """The text stack: Qwen3's dense decoder (q/k norms)."""

    spec_overrides = {"qk_norm": True}


class Qwen3VLMoeTextLoader(Qwen3VLTextLoader):
    """Qwen3-VL-MoE's text stack: sparse layers (`qwen_sparse_layer`) have a MoE block (softmax router, top
    ``num_experts_per_tok`` always renormalised, fused experts, no shared expert); the others a dense
    SwiGLU MLP."""

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The dense stack's tensors with each sparse layer's MLP replaced by its router and fused experts."""
        return with_sparse_mlp_shapes(super().checkpoint_shapes(config), config)

    def feed_forward(self, spec: DecoderSpec, layer: int) -> Callable[[Array], Array]:
        config = self.source.config
        if not qwen_sparse_layer(config, layer):
            return super().feed_forward(spec, layer)
        router = router_spec_from_config(config, f"{self.origin}/config.json", scoring="softmax", normalize_top_k=True)
        return load_moe(self, f"model.layers.{layer}.mlp.", router)


class Qwen3VLLoader(ModelWeightLoader):
    """Text stack plus vision tower (see the module docstring). Split over ranks, the text stack splits as
    core's dense decoder does (its MoE layers by experts) and rank 0 alone holds the tower
    (`loads_vision_tower`)."""

    text_loader: type[DenseDecoderLoader] = Qwen3VLTextLoader
    supports_tensor_parallel = True
    supports_expert_parallel = True

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The text stack's tensors (under ``model.language_model.``) and the vision tower's."""
        text = cls.text_loader.checkpoint_shapes(text_config(config))
        shapes = {TextStackSource.stored(name): shape for name, shape in text.items()}
        return shapes | tower_shapes(config.get("vision_config") or {})

    def build(self) -> TransformerModel:
        source = TextStackSource(self.source, self.origin)
        text = self.text_loader(source, self.backend, self.registry, self.origin, self.max_positions, self.parallel)
        model = text.build()
        if self.loads_vision_tower:
            model.vision = attach_vision(self, text.spec().rope)
        return model


class Qwen3VLMoeLoader(Qwen3VLLoader):
    """``qwen3_vl_moe``: the same tower over Qwen3-VL-MoE's text stack."""

    text_loader = Qwen3VLMoeTextLoader
