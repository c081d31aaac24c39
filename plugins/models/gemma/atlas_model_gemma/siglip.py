"""Gemma 3's vision side as layers: the SigLIP tower and the multimodal projector.

Layer types registered by this plugin: ``siglip_encoder_layer`` (a pre-norm ViT block: LayerNorm,
attention with biases over each image's patches, LayerNorm, gelu-tanh MLP; core's ViT block
(``vision_block``) run without rotary, with the q/k/v projections fused at load) and
``gemma3_multimodal_projector`` (average pooling of the patch grid to ``mm_tokens_per_image`` tokens,
Gemma's ``1 + w`` RMSNorm, projection to the text width).
`SiglipTower.encode` runs patch embedding, learned positions, the encoder layers, the post-LayerNorm and
the projector over several images at once.

The LayerNorm, GELU and per-image attention ops are core's ``vision`` op group; the pooling is the
``gemma`` group's ``pool_patches``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.layers.vision import LayerNorm, Linear, VisionBlock, VisionPatches
from atlas_core.model.vision import ImageFeatures, PreparedImage
from atlas_model_gemma.ops import GemmaOps


class SiglipEncoderLayer(VisionBlock):
    """SigLIP's encoder layer: ``x + out_proj(attention(layer_norm1(x)))``, then
    ``+ fc2(gelu_tanh(fc1(layer_norm2(x))))``; the attention (scale ``head_dim**-0.5``) is full within each
    image and has no rotary (`VisionPatches` without rows). Constructor: ``(backend, layer_norm1, qkv,
    out_proj, layer_norm2, fc1, fc2, num_heads)`` with ``qkv`` the q, k and v projections fused by rows."""


class MultiModalProjector:
    """Gemma 3's projector: ``x[n * side**2, C]`` (each image's patches row-major) -> ``[n * tokens, H]``:
    ``kernel x kernel`` average pooling, ``norm`` (``1 + w`` folded into its weight), then ``projection``
    (``mm_input_projection_weight`` transposed to ``[H, C]``, no bias)."""

    def __init__(self, backend: Backend, norm: RMSNorm, projection: Linear, side: int, kernel: int) -> None:
        self.backend, self.norm, self.projection = backend, norm, projection
        self.side, self.kernel = side, kernel

    def __call__(self, x: Array) -> Array:
        grids = [(self.side, self.side)] * (x.shape[0] // self.side**2)
        pooled = self.backend.ops(GemmaOps).pool_patches(x, grids, self.kernel)
        return self.projection(self.norm(pooled)[0])


def patchify(pixels: np.ndarray, patch: int) -> np.ndarray:
    """Images ``[n, 3, H, W]`` -> patches ``[n * (H / patch) * (W / patch), 3 * patch * patch]``, each image's
    patches row-major, each patch flattened as ``(channel, row, column)`` (a conv weight's layout)."""
    n, channels, height, width = pixels.shape
    grid = pixels.reshape(n, channels, height // patch, patch, width // patch, patch)
    return np.ascontiguousarray(grid.transpose(0, 2, 4, 1, 3, 5).reshape(-1, channels * patch * patch))


@dataclass
class SiglipTower:
    """The tower's weights as layers: ``patch_embed`` (the conv as a linear over flattened patches),
    ``positions`` (the learned ``[side * side, C]`` table, a backend array), the encoder ``layers``,
    ``post_norm`` and the ``projector``."""

    backend: Backend
    patch_embed: Linear
    positions: Array
    layers: list[SiglipEncoderLayer]
    post_norm: LayerNorm
    projector: MultiModalProjector
    patch_size: int

    def encode(self, images: Sequence[PreparedImage]) -> list[ImageFeatures]:
        """Every image's ``num_tokens`` features ``[num_tokens, H]`` (no deepstack), in one pass over all
        patches; each image attends to its own patches only."""
        backend, count = self.backend, len(images)
        pixels = np.stack([image.pixel_values for image in images]).astype(np.float32)
        x = self.patch_embed(backend.from_numpy(patchify(pixels, self.patch_size)))
        per_image, width = self.positions.shape
        x = (x.reshape(count, per_image, width) + self.positions).reshape(count * per_image, width)
        patches = VisionPatches(np.arange(count + 1, dtype=np.int64) * per_image)
        for layer in self.layers:
            x = layer(x, patches)
        tokens = self.projector(self.post_norm(x))
        per_token = tokens.shape[0] // count
        return [ImageFeatures(tokens[i * per_token : (i + 1) * per_token], []) for i in range(count)]
