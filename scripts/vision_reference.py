"""What the vision references of every family's tiny vision-language fixtures share (Qwen's in
``qwen_vision_reference.py``, Gemma 3's and Gemma 4's in ``gemma_vision_reference.py``).

A family's ``extra_reference`` writes the two images (`write_images`), its processor's
``preprocessor_config.json``, each image's processor output and tower features, then runs two image + text
prompts through the model (`prompt_reference`) and saves everything as ``vision_reference.npz`` (the format
``atlas_core/testing/vision_parity.py`` documents).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch

IMAGE_SIZES = {"image_a.png": (45, 30), "image_b.png": (20, 36)}  # (width, height)
GREEDY_TOKENS = 8
REFERENCE_FILE = "vision_reference.npz"


def make_image(size: tuple[int, int], seed: int) -> np.ndarray:
    """A deterministic RGB picture: smooth gradients plus noise, ``[height, width, 3]`` uint8."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)


def write_images(dest: Path) -> dict[str, Path]:
    """Write the two images into ``dest`` -> their paths by key (``a``, ``b``)."""
    from PIL import Image

    paths = {}
    for i, (name, size) in enumerate(IMAGE_SIZES.items()):
        Image.fromarray(make_image(size, 7 + i)).save(dest / name)
        paths[name.removesuffix(".png").removeprefix("image_")] = dest / name
    return paths


def text_tokens(rng: np.random.Generator, n: int, below: int) -> list[int]:
    """``n`` random text token ids below ``below`` (where the special vision tokens start)."""
    return rng.integers(0, below, size=n).tolist()


def prompt_reference(
    model: Any, i: int, ids: list[int], images: list[str], out: dict[str, np.ndarray], **kwargs: Any
) -> None:
    """Prompt ``i`` (token ids ``ids``, placeholders expanded; ``images``: its image keys in order) through
    ``model`` with the model's image inputs ``kwargs``: ``prompt_i``, ``images_i``, ``logprobs_i`` (every
    position, one forward), ``greedy_i`` and ``greedy_logprobs_i`` (``generate``, EOS ignored) and
    ``bf16_drift_i`` (`bf16_drift`) into ``out``."""
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, use_cache=False, attention_mask=torch.ones_like(input_ids), **kwargs
        ).logits[0]
        gen = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
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
    out[f"greedy_{i}"] = gen.sequences[0, len(ids) :].numpy()
    out[f"greedy_logprobs_{i}"] = torch.log_softmax(step_logits, -1).numpy()
    out[f"bf16_drift_{i}"] = bf16_drift(model, input_ids, **kwargs)
    top = torch.topk(torch.cat([logits, step_logits]), 2, dim=-1).values
    print(f"    vision prompt {i}: {len(ids)} tokens, min top-2 margin {float((top[:, 0] - top[:, 1]).min()):.4f}")


def bf16_drift(model: Any, input_ids: torch.Tensor, **kwargs: Any) -> np.ndarray:
    """transformers' own bf16 noise on a prompt: per position, the largest |log-prob difference| over the
    probable tokens (p > 1e-3) between ``model`` with its weights rounded to bf16 run in float32 and the same
    weights run in bf16 (floating inputs cast too) -> float32 ``[positions]``. A bf16 backend checked against
    a float32 one on the same rounded weights is held to no more than this drift."""
    rounded = copy.deepcopy(model)
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        for parameter in rounded.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
        want = torch.log_softmax(rounded(input_ids=input_ids, attention_mask=mask, **kwargs).logits[0], -1)
        rounded.to(torch.bfloat16)
        cast = {k: v.to(torch.bfloat16) if torch.is_floating_point(v) else v for k, v in kwargs.items()}
        got = torch.log_softmax(rounded(input_ids=input_ids, attention_mask=mask, **cast).logits[0].float(), -1)
    probable = want > np.log(1e-3)
    return np.asarray(
        [float((g - w).abs()[p].max()) for g, w, p in zip(got, want, probable, strict=True)], dtype=np.float32
    )
