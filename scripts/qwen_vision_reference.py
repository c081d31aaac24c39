"""Vision references of Qwen's tiny vision-language fixtures (Qwen3-VL, Qwen3.5), shared by their spec modules.

`vision_reference` writes into a fixture folder two small PNG images, the image processor's
``preprocessor_config.json`` (a pixel budget small enough for tiny grids) and ``vision_reference.npz``:

- ``pixel_values_{a,b}``, ``grid_{a,b}``: the processor's output for each image;
- ``embeds_{a,b}``: the tower's merged features; ``deepstack_{a,b}`` ``[layers, tokens, H]`` its
  deepstack features (absent for towers without them);
- for two image + text prompts ``i``: ``prompt_i`` (placeholders expanded), ``images_i`` (which images, in
  order), ``logprobs_i`` (every position), ``mrope_positions_i`` / ``mrope_delta_i`` (transformers'
  ``get_rope_index``), ``greedy_i`` and ``greedy_logprobs_i`` (``generate``, EOS ignored).

Text token ids stay below `VISION_START`; the config's special vision tokens are `VISION_START`,
`VISION_END`, `IMAGE` and `VIDEO`, inside the tiny vocabulary of 256. The images and the prompt runs are
``vision_reference.py``'s, shared with the other families.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from vision_reference import REFERENCE_FILE, prompt_reference, text_tokens, write_images

VISION_START, VISION_END, IMAGE, VIDEO = 248, 249, 250, 251
PATCH, MERGE, TEMPORAL = 4, 2, 2
MIN_PIXELS, MAX_PIXELS = 16 * 16, 64 * 64


def tiny_tower(text: dict[str, Any], **settings: Any) -> dict[str, Any]:
    """A tiny ``vision_config`` (width 32, two heads, patch 4, temporal patch 2, 2x2 merge, a 4x4 learned
    position grid) feeding a text stack of ``text``'s width, with ``settings`` (``depth``, ...) on top."""
    return {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "num_position_embeddings": 16,
        "initializer_range": text["initializer_range"],
        **settings,
    }


def placeholder(tokens: int) -> list[int]:
    return [VISION_START] + [IMAGE] * tokens + [VISION_END]


def vision_reference(model: Any, dest: Path) -> None:
    """Write the images, ``preprocessor_config.json`` and ``vision_reference.npz`` of ``model`` (a
    transformers ``*ForConditionalGeneration`` with a Qwen ViT under ``model.model.visual``) into ``dest``."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH,
        temporal_patch_size=TEMPORAL,
        merge_size=MERGE,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )
    processor.save_pretrained(dest)
    out: dict[str, np.ndarray] = {}
    features = {}
    for key, path in write_images(dest).items():
        with Image.open(path) as image:
            batch = processor(images=[image], return_tensors="pt")
        out[f"pixel_values_{key}"] = batch["pixel_values"].numpy().astype(np.float32)
        out[f"grid_{key}"] = batch["image_grid_thw"].numpy()[0]
        with torch.no_grad():
            vision = model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"], return_dict=True)
        out[f"embeds_{key}"] = vision.pooler_output.numpy()
        if getattr(vision, "deepstack_features", None):
            out[f"deepstack_{key}"] = torch.stack(vision.deepstack_features).numpy()
        features[key] = (batch, int(batch["image_grid_thw"][0].prod()) // MERGE**2)
    rng = np.random.default_rng(20)

    def text(n: int) -> list[int]:
        return text_tokens(rng, n, VISION_START)

    prompts = [
        (text(5) + placeholder(features["a"][1]) + text(6), ["a"]),
        (text(3) + placeholder(features["b"][1]) + text(2) + placeholder(features["a"][1]) + text(4), ["b", "a"]),
    ]
    for i, (ids, images) in enumerate(prompts):
        input_ids = torch.tensor([ids])
        kwargs = {
            "pixel_values": torch.cat([features[k][0]["pixel_values"] for k in images]),
            "image_grid_thw": torch.cat([features[k][0]["image_grid_thw"] for k in images]),
            "mm_token_type_ids": (input_ids == IMAGE).int(),
        }
        prompt_reference(model, i, ids, images, out, **kwargs)
        with torch.no_grad():
            positions, delta = model.model.get_rope_index(
                input_ids=input_ids,
                mm_token_type_ids=kwargs["mm_token_type_ids"],
                image_grid_thw=kwargs["image_grid_thw"],
            )
        out[f"mrope_positions_{i}"] = positions[:, 0].numpy()
        out[f"mrope_delta_{i}"] = delta.numpy().reshape(())
    np.savez(dest / REFERENCE_FILE, **out)
