"""Loading Qwen's vision side from any text-stack loader: the ViT tower under ``model.visual.*`` (Qwen3-VL's,
with deepstack mergers when ``deepstack_visual_indexes`` names blocks; Qwen3.5 / Qwen3.6's, the same tower
without them) and the `Qwen3VLVision` that pairs it with the text model's M-RoPE.

Families whose checkpoints carry this tower (``qwen3_vl``, ``qwen3_vl_moe`` here; ``qwen3_5`` and
``qwen3_5_moe`` in ``atlas-model-qwen3-next``) call `attach_vision` from their loader's ``build``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.vision import LayerNorm, Linear
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.rope import RopeSpec, inverse_frequencies
from atlas_model_qwen3_vl.layers import PatchMerger
from atlas_model_qwen3_vl.processor import ImageProcessor
from atlas_model_qwen3_vl.tower import VisionTower
from atlas_model_qwen3_vl.vision import Qwen3VLVision

VISION_PREFIX = "model.visual."
TOWER_PROBE = VISION_PREFIX + "patch_embed.proj.weight"
"""A tensor every checkpoint with the tower holds."""


def attach_vision(loader: ModelWeightLoader, rope: RopeSpec) -> Qwen3VLVision:
    """The vision side of ``loader``'s checkpoint (its ``vision_config``, ``image_token_id`` and
    ``preprocessor_config.json``) for a text model whose RoPE is ``rope``: interleaved M-RoPE with three
    ``mrope_section`` sizes adding up to half the rotary dimension, else `ModelLoadError` naming the file."""
    config, origin = loader.source.config, loader.origin
    sections = rope.scaling.get("mrope_section")
    if not sections or len(sections) != 3 or sum(sections) != rope.rotary_dim // 2:
        raise ModelLoadError(
            f"{origin}/config.json: mrope_section {sections} must be three sections adding up to "
            f"{rope.rotary_dim // 2} (half the rotary dimension)"
        )
    if not rope.scaling.get("mrope_interleaved", True):
        raise ModelLoadError(f"{origin}/config.json: only interleaved M-RoPE (mrope_interleaved) is supported")
    if "image_token_id" not in config:
        raise ModelLoadError(f"{origin}/config.json: a vision-language config needs image_token_id")
    inv_freq, factor = inverse_frequencies(rope)
    vision_config = config.get("vision_config") or {}
    return Qwen3VLVision(
        ImageProcessor.from_folder(Path(origin), vision_config),
        load_tower(loader, vision_config),
        int(config["image_token_id"]),
        inv_freq,
        sections,
        factor,
    )


def load_tower(loader: ModelWeightLoader, vision: dict[str, Any]) -> VisionTower:
    """The vision tower from ``model.visual.*`` and ``vision_config`` ``vision``, its blocks and mergers
    built from the registered ``vision_block`` (core's) and ``qwen3_vl_patch_merger`` layers."""
    backend, p = loader.backend, VISION_PREFIX
    block_type, merger_type = loader.layer_type("vision_block"), loader.layer_type("qwen3_vl_patch_merger")
    heads, merge = int(vision.get("num_heads", 16)), int(vision.get("spatial_merge_size", 2))
    if vision.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(
            f"{loader.origin}/config.json: vision hidden_act {vision.get('hidden_act')!r} is not supported"
        )

    def linear(name: str) -> Linear:
        return Linear(backend, loader.upload(name + ".weight"), loader.upload(name + ".bias"))

    def norm(name: str) -> LayerNorm:
        return LayerNorm(backend, loader.upload(name + ".weight"), loader.upload(name + ".bias"))

    def merger(name: str, post_shuffle: bool) -> PatchMerger:
        return merger_type(
            backend,
            norm(name + ".norm"),
            linear(name + ".linear_fc1"),
            linear(name + ".linear_fc2"),
            merge * merge,
            post_shuffle,
        )

    patch = loader.tensor(p + "patch_embed.proj.weight")
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
    deepstack = [int(i) for i in vision.get("deepstack_visual_indexes") or []]
    return VisionTower(
        backend,
        Linear(
            backend, loader.upload_arrays(patch.reshape(patch.shape[0], -1)), loader.upload(p + "patch_embed.proj.bias")
        ),
        loader.tensor(p + "pos_embed.weight").astype(np.float32),
        blocks,
        merger(p + "merger", post_shuffle=False),
        deepstack,
        [merger(f"{p}deepstack_merger_list.{i}", post_shuffle=True) for i in range(len(deepstack))],
        heads,
        merge,
        float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
    )


def tower_shapes(vision: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the vision tower with ``vision_config`` ``vision``, by checkpoint name."""
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
    deepstack = len(vision.get("deepstack_visual_indexes") or [])
    mergers = [(p + "merger", width)] + [(f"{p}deepstack_merger_list.{i}", merged) for i in range(deepstack)]
    for name, normed in mergers:
        norm(name + ".norm", normed)
        linear(name + ".linear_fc1", merged, merged)
        linear(name + ".linear_fc2", out, merged)
    return shapes
