"""``qwen3_vl`` and ``qwen3_vl_moe``: Qwen3-VL checkpoints. The text stack (``model.language_model.*``,
settings under ``text_config``) is core's dense decoder with Qwen3's q/k norms (and, for Qwen3-VL-MoE,
MoE feed-forward layers), read through `TextStackSource`; the vision tower (``model.visual.*``,
``vision_config``) is built from this plugin's registered layers and attached as the model's
`atlas_core.model.vision.VisionModel`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.moe import load_moe, router_spec_from_config
from atlas_core.model.loader import DenseDecoderLoader, ModelWeightLoader
from atlas_core.model.rope import inverse_frequencies
from atlas_core.model.sparse_layers import qwen_sparse_layer, with_sparse_mlp_shapes
from atlas_core.model.spec import DecoderSpec
from atlas_core.model.transformer import TransformerModel
from atlas_core.weights.quantized import QuantizedWeight
from atlas_core.weights.source import WeightSource, quantized_tensor, tensor_part, tensor_shape
from atlas_model_qwen3_vl.layers import LayerNorm, Linear, PatchMerger
from atlas_model_qwen3_vl.processor import ImageProcessor
from atlas_model_qwen3_vl.tower import VisionTower
from atlas_model_qwen3_vl.vision import Qwen3VLVision

TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."


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
    """Text stack plus vision tower (see the module docstring)."""

    text_loader: type[DenseDecoderLoader] = Qwen3VLTextLoader

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The text stack's tensors (under ``model.language_model.``) and the vision tower's."""
        text = cls.text_loader.checkpoint_shapes(text_config(config))
        shapes = {TextStackSource.stored(name): shape for name, shape in text.items()}
        return shapes | tower_shapes(config.get("vision_config") or {})

    def build(self) -> TransformerModel:
        text = self.text_loader(
            TextStackSource(self.source, self.origin), self.backend, self.registry, self.origin, self.max_positions
        )
        model = text.build()
        spec = text.spec()
        config = self.source.config
        rope = spec.rope.scaling
        sections = rope.get("mrope_section")
        if not sections or len(sections) != 3 or sum(sections) != spec.rope.rotary_dim // 2:
            raise ModelLoadError(
                f"{self.origin}/config.json: mrope_section {sections} must be three sections adding up to "
                f"{spec.rope.rotary_dim // 2} (half the rotary dimension)"
            )
        if not rope.get("mrope_interleaved", True):
            raise ModelLoadError(f"{self.origin}/config.json: only interleaved M-RoPE (mrope_interleaved) is supported")
        inv_freq, factor = inverse_frequencies(spec.rope)
        vision_config = config.get("vision_config") or {}
        model.vision = Qwen3VLVision(
            ImageProcessor.from_folder(Path(self.origin), vision_config),
            self.tower(vision_config),
            int(config.get("image_token_id", 151655)),
            inv_freq,
            sections,
            factor,
        )
        return model

    def tower(self, vision: dict[str, Any]) -> VisionTower:
        """The vision tower from ``model.visual.*`` and ``vision_config``."""
        backend, p = self.backend, VISION_PREFIX
        block_type, merger_type = self.layer_type("qwen3_vl_vision_block"), self.layer_type("qwen3_vl_patch_merger")
        heads, merge = int(vision.get("num_heads", 16)), int(vision.get("spatial_merge_size", 2))
        if vision.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ModelLoadError(
                f"{self.origin}/config.json: vision hidden_act {vision.get('hidden_act')!r} is not supported"
            )

        def linear(name: str) -> Linear:
            return Linear(backend, self.upload(name + ".weight"), self.upload(name + ".bias"))

        def norm(name: str) -> LayerNorm:
            return LayerNorm(backend, self.upload(name + ".weight"), self.upload(name + ".bias"))

        def merger(name: str, post_shuffle: bool) -> PatchMerger:
            return merger_type(
                backend,
                norm(name + ".norm"),
                linear(name + ".linear_fc1"),
                linear(name + ".linear_fc2"),
                merge * merge,
                post_shuffle,
            )

        patch = self.tensor(p + "patch_embed.proj.weight")
        blocks = [
            block_type(
                backend,
                norm(f"{p}blocks.{i}.norm1"),
                linear(f"{p}blocks.{i}.attn.qkv"),
                linear(f"{p}blocks.{i}.attn.proj"),
                norm(f"{p}blocks.{i}.norm2"),
                linear(f"{p}blocks.{i}.mlp.linear_fc1"),
                linear(f"{p}blocks.{i}.mlp.linear_fc2"),
                heads,
            )
            for i in range(int(vision.get("depth", 0)))
        ]
        deepstack = [int(i) for i in vision.get("deepstack_visual_indexes", [])]
        return VisionTower(
            backend,
            Linear(
                backend, self.upload_arrays(patch.reshape(patch.shape[0], -1)), self.upload(p + "patch_embed.proj.bias")
            ),
            self.tensor(p + "pos_embed.weight").astype(np.float32),
            blocks,
            merger(p + "merger", post_shuffle=False),
            deepstack,
            [merger(f"{p}deepstack_merger_list.{i}", post_shuffle=True) for i in range(len(deepstack))],
            heads,
            merge,
            float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        )


class Qwen3VLMoeLoader(Qwen3VLLoader):
    """``qwen3_vl_moe``: the same tower over Qwen3-VL-MoE's text stack."""

    text_loader = Qwen3VLMoeTextLoader


def tower_shapes(vision: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3-VL vision tower with ``vision_config`` ``vision``, by checkpoint name."""
    p, width = VISION_PREFIX, int(vision.get("hidden_size", 1152))
    inter, merge = int(vision.get("intermediate_size", 4304)), int(vision.get("spatial_merge_size", 2))
    patch, frames = int(vision.get("patch_size", 16)), int(vision.get("temporal_patch_size", 2))
    merged, out = width * merge * merge, int(vision.get("out_hidden_size", 3584))
    shapes: dict[str, tuple[int, ...]] = {
        p + "patch_embed.proj.weight": (width, int(vision.get("in_channels", 3)), frames, patch, patch),
        p + "patch_embed.proj.bias": (width,),
        p + "pos_embed.weight": (int(vision.get("num_position_embeddings", 2304)), width),
    }

    def linear(name: str, rows: int, columns: int) -> None:
        shapes.update({name + ".weight": (rows, columns), name + ".bias": (rows,)})

    def norm(name: str, size: int) -> None:
        shapes.update({name + ".weight": (size,), name + ".bias": (size,)})

    for i in range(int(vision.get("depth", 0))):
        b = f"{p}blocks.{i}."
        norm(b + "norm1", width)
        norm(b + "norm2", width)
        linear(b + "attn.qkv", 3 * width, width)
        linear(b + "attn.proj", width, width)
        linear(b + "mlp.linear_fc1", inter, width)
        linear(b + "mlp.linear_fc2", width, inter)
    deepstack = len(vision.get("deepstack_visual_indexes", []))
    mergers = [(p + "merger", width)] + [(f"{p}deepstack_merger_list.{i}", merged) for i in range(deepstack)]
    for name, normed in mergers:
        norm(name + ".norm", normed)
        linear(name + ".linear_fc1", merged, merged)
        linear(name + ".linear_fc2", out, merged)
    return shapes
