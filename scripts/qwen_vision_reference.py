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
`VISION_END`, `IMAGE` and `VIDEO`, inside the tiny vocabulary of 256.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

VISION_START, VISION_END, IMAGE, VIDEO = 248, 249, 250, 251
PATCH, MERGE, TEMPORAL = 4, 2, 2
MIN_PIXELS, MAX_PIXELS = 16 * 16, 64 * 64
IMAGE_SIZES = {"image_a.png": (45, 30), "image_b.png": (20, 36)}  # (width, height)
GREEDY_TOKENS = 8


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


def make_image(name: str, size: tuple[int, int], seed: int) -> np.ndarray:
    """A deterministic RGB picture: smooth gradients plus noise, ``[height, width, 3]`` uint8."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)


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
    for i, (name, size) in enumerate(IMAGE_SIZES.items()):
        Image.fromarray(make_image(name, size, 7 + i)).save(dest / name)
        with Image.open(dest / name) as image:
            batch = processor(images=[image], return_tensors="pt")
        key = name.removesuffix(".png").removeprefix("image_")
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
        return rng.integers(0, VISION_START, size=n).tolist()

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
            "attention_mask": torch.ones_like(input_ids),
        }
        with torch.no_grad():
            logits = model(input_ids=input_ids, use_cache=False, **kwargs).logits[0]
            positions, delta = model.model.get_rope_index(
                input_ids=input_ids,
                mm_token_type_ids=kwargs["mm_token_type_ids"],
                image_grid_thw=kwargs["image_grid_thw"],
            )
            gen = model.generate(
                input_ids=input_ids,
                do_sample=False,
                max_new_tokens=GREEDY_TOKENS,
                min_new_tokens=GREEDY_TOKENS,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
                **kwargs,
            )
        step_logits = torch.stack([lg[0] for lg in gen.logits])
        out[f"prompt_{i}"] = np.asarray(ids, dtype=np.int64)
        out[f"images_{i}"] = np.asarray(images)
        out[f"logprobs_{i}"] = torch.log_softmax(logits, -1).numpy()
        out[f"mrope_positions_{i}"] = positions[:, 0].numpy()
        out[f"mrope_delta_{i}"] = delta.numpy().reshape(())
        out[f"greedy_{i}"] = gen.sequences[0, len(ids) :].numpy()
        out[f"greedy_logprobs_{i}"] = torch.log_softmax(step_logits, -1).numpy()
        top = torch.topk(torch.cat([logits, step_logits]), 2, dim=-1).values
        print(f"    vision prompt {i}: {len(ids)} tokens, min top-2 margin {float((top[:, 0] - top[:, 1]).min()):.4f}")
    np.savez(dest / "vision_reference.npz", **out)
