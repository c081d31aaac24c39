"""``qwen3_vl``: Qwen3-VL checkpoints. The text stack (``model.language_model.*``, settings under
``text_config``) is core's dense decoder with Qwen3's q/k norms, read through `TextStackSource`; the
vision tower (``model.visual.*``, ``vision_config``) is built from this plugin's registered layers and
attached as the model's `atlas_core.model.vision.VisionModel`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.errors import ModelLoadError
from atlas_core.model.loader import DenseDecoderLoader, ModelWeightLoader
from atlas_core.model.rope import inverse_frequencies
from atlas_core.model.transformer import TransformerModel
from atlas_core.weights.source import WeightSource
from atlas_model_qwen3_vl.layers import LayerNorm, Linear, PatchMerger
from atlas_model_qwen3_vl.processor import ImageProcessor
from atlas_model_qwen3_vl.tower import VisionTower
from atlas_model_qwen3_vl.vision import Qwen3VLVision

TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."


class TextStackSource:
    """A vision-language checkpoint's text stack seen as a text-only checkpoint: ``config`` is its
    ``text_config`` (with the top-level ``tie_word_embeddings`` and ``quantization_config``), and text names
    ``model.X`` read ``model.language_model.X``; other names (``lm_head.weight``) pass through."""

    def __init__(self, source: WeightSource, origin: str) -> None:
        text = source.config.get("text_config")
        if not isinstance(text, dict):
            raise ModelLoadError(
                f"{origin}/config.json: a {source.config.get('model_type')!r} config needs text_config"
            )
        self.source = source
        self.config: dict[str, Any] = {**text, "tie_word_embeddings": source.config.get("tie_word_embeddings", False)}
        if "quantization_config" in source.config:
            self.config["quantization_config"] = source.config["quantization_config"]

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

    def get(self, name: str) -> np.ndarray:
        return self.source.get(self.stored(name))

    def __getattr__(self, attribute: str) -> Callable[..., Any]:
        """The optional readers (``get_quantized``, ``shape``, ``get_part``) of the underlying source, renamed."""
        if attribute not in ("get_quantized", "shape", "get_part"):
            raise AttributeError(attribute)
        method = getattr(self.source, attribute)
        return lambda name, *args: method(self.stored(name), *args)


class Qwen3VLTextLoader(DenseDecoderLoader):
    """The text stack: Qwen3's dense decoder (q/k norms)."""

    spec_overrides = {"qk_norm": True}


class Qwen3VLLoader(ModelWeightLoader):
    """Text stack plus vision tower (see the module docstring)."""

    def build(self) -> TransformerModel:
        text = Qwen3VLTextLoader(
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
