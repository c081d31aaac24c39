"""Qwen3-VL's patch merger, registered by this plugin as ``qwen3_vl_patch_merger`` (2x2 patch merge into
the language model's width); the ViT blocks are core's ``vision_block`` (`atlas_core.model.layers.vision`)."""

from __future__ import annotations

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.vision import VisionOps
from atlas_core.model.layers.vision import LayerNorm, Linear


class PatchMerger:
    """Each ``merge x merge`` block of patches (consecutive rows) -> one token: LayerNorm (over each patch,
    or over the concatenated block when ``post_shuffle``), then ``fc2(gelu(fc1(.)))``."""

    def __init__(
        self, backend: Backend, norm: LayerNorm, fc1: Linear, fc2: Linear, merge_units: int, post_shuffle: bool
    ) -> None:
        self.backend, self.norm, self.fc1, self.fc2 = backend, norm, fc1, fc2
        self.merge_units, self.post_shuffle = merge_units, post_shuffle

    def __call__(self, x: Array) -> Array:
        width = x.shape[1] * self.merge_units
        merged = self.norm(x.reshape(-1, width)) if self.post_shuffle else self.norm(x).reshape(-1, width)
        return self.fc2(self.backend.ops(VisionOps).gelu(self.fc1(merged), approximate=False))
