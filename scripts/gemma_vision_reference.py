"""Vision references of the Gemma tiny vision-language fixtures (``gemma3_vl``, ``gemma4_vl``), for their spec
module (the gemma plugin's ``tests/fixtures/tiny_specs.py``): the two configs with their towers and token ids,
and the ``extra_reference`` writers of each, built on `vision_reference` (images, ``preprocessor_config.json``
from transformers' own PIL processor, ``vision_reference.npz``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Gemma3Config, Gemma3TextConfig, Gemma4Config, Gemma4TextConfig
from vision_reference import REFERENCE_FILE, prompt_reference, text_tokens, write_images

BOI, EOI, IMAGE = 253, 254, 255  # inside the tiny vocabulary of 256; text tokens of image prompts stay below
IMAGE_SIZE, PATCH, TOKENS = 32, 4, 16  # an 8 x 8 patch grid pooled 2 x 2 into 16 tokens
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def gemma3_vl(**text: Any) -> Gemma3Config:
    """A tiny Gemma 3 vision-language config: the given text stack, a two-layer SigLIP tower (width 32,
    two heads, 32 px images in 4 px patches, no pooling head, as Gemma 3's) and 16 tokens per image."""
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "vision_use_head": False,
    }
    return Gemma3Config(
        text_config=Gemma3TextConfig(**text),
        vision_config=vision,
        mm_tokens_per_image=TOKENS,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=IMAGE,
    )


def gemma3_vision_reference(model: Any, dest: Path) -> None:
    """The images, ``preprocessor_config.json`` (transformers' PIL processor at 32 px, bilinear, CLIP's mean
    and std so the channels differ) and ``vision_reference.npz`` of a ``Gemma3ForConditionalGeneration``:
    pixel values ``[3, 32, 32]``, grid ``(1, 8, 8)``, the projector's features, and two prompts laid out as
    the processor writes them (``boi``, the image tokens, ``eoi``), run with ``token_type_ids`` so image
    tokens attend bidirectionally within their image."""
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    processor = Gemma3ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_mean=CLIP_MEAN, image_std=CLIP_STD
    )
    processor.save_pretrained(dest)
    out: dict[str, np.ndarray] = {}
    pixels = {}
    for key, path in write_images(dest).items():
        with Image.open(path) as image:
            pixels[key] = processor(images=[image], return_tensors="pt")["pixel_values"]
        out[f"pixel_values_{key}"] = pixels[key][0].numpy().astype(np.float32)
        out[f"grid_{key}"] = np.asarray([1, IMAGE_SIZE // PATCH, IMAGE_SIZE // PATCH])
        with torch.no_grad():
            out[f"embeds_{key}"] = (
                model.model.get_image_features(pixels[key], return_dict=True).pooler_output[0].numpy()
            )
    rng = np.random.default_rng(30)

    def text(n: int) -> list[int]:
        return text_tokens(rng, n, BOI)

    image = [BOI] + [IMAGE] * TOKENS + [EOI]
    prompts = [(text(5) + image + text(6), ["a"]), (text(3) + image + text(2) + image + text(4), ["b", "a"])]
    for i, (ids, keys) in enumerate(prompts):
        kwargs = {
            "pixel_values": torch.cat([pixels[k] for k in keys]),
            "token_type_ids": (torch.tensor([ids]) == IMAGE).long(),
        }
        prompt_reference(model, i, ids, keys, out, **kwargs)
    np.savez(dest / REFERENCE_FILE, **out)


V4_PATCH, V4_KERNEL, V4_SOFT_TOKENS = 4, 3, 70  # 70: the smallest budget Gemma 4's processor accepts


def gemma4_vl(**text: Any) -> Gemma4Config:
    """A tiny Gemma 4 vision-language config: the given text stack and a two-layer vision tower (width 32,
    two heads of 16, 4 px patches pooled 3 x 3, a 64-entry 2-D position table, clipped linears and
    standardisation on); boi / eoi / image tokens as Gemma 3's fixture."""
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": V4_PATCH,
        "pooling_kernel_size": V4_KERNEL,
        "position_embedding_size": 64,
        "use_clipped_linears": True,
        "standardize": True,
    }
    return Gemma4Config(
        text_config=Gemma4TextConfig(**text),
        vision_config=vision,
        audio_config=None,
        boi_token_id=BOI,
        eoi_token_id=EOI,
        image_token_id=IMAGE,
    )


def gemma4_vision_reference(model: Any, dest: Path) -> None:
    """The images, ``preprocessor_config.json`` (transformers' PIL processor: 4 px patches, 3 x 3 pooling, the
    70-token budget, bicubic) and ``vision_reference.npz`` of a ``Gemma4ForConditionalGeneration``: each
    image's pixel values without the processor's padding rows (``[patches, 48]``, asserted zero past them,
    their positions asserted row-major), grid ``(1, rows, columns)`` in patches, the embedded features, and
    two prompts laid out as ``Gemma4Processor`` writes them (``boi``, the image tokens, ``eoi``), run with
    ``mm_token_type_ids`` so image tokens attend bidirectionally within their image on sliding layers; and
    what ``Gemma4Processor.replace_image_token`` writes for a two-token image with Gemma 4's token strings
    (``template_*``)."""
    from types import SimpleNamespace

    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    processor = Gemma4ImageProcessorPil(
        patch_size=V4_PATCH, pooling_kernel_size=V4_KERNEL, max_soft_tokens=V4_SOFT_TOKENS
    )
    processor.save_pretrained(dest)
    strings = SimpleNamespace(boi_token="<|image>", image_token="<|image|>", eoi_token="<image|>")
    out: dict[str, np.ndarray] = {
        "template_boi": np.asarray(strings.boi_token),
        "template_eoi": np.asarray(strings.eoi_token),
        "template_image": np.asarray(strings.image_token),
        "template_replacement": np.asarray(
            Gemma4Processor.replace_image_token(strings, {"num_soft_tokens_per_image": [2]}, 0)
        ),
    }
    inputs, tokens = {}, {}
    for key, path in write_images(dest).items():
        with Image.open(path) as image:
            inputs[key] = processor(images=[image], return_tensors="pt")
        pixels, positions = inputs[key]["pixel_values"][0], inputs[key]["image_position_ids"][0]
        real = int((positions[:, 0] >= 0).sum())
        columns, rows = int(positions[:real, 0].max()) + 1, int(positions[:real, 1].max()) + 1
        grid_x, grid_y = np.meshgrid(np.arange(columns), np.arange(rows), indexing="xy")
        assert np.array_equal(positions[:real].numpy(), np.stack([grid_x, grid_y], -1).reshape(-1, 2))
        assert not pixels[real:].any() and (positions[real:] == -1).all()
        out[f"pixel_values_{key}"] = pixels[:real].numpy().astype(np.float32)
        out[f"grid_{key}"] = np.asarray([1, rows, columns])
        tokens[key] = int(inputs[key]["num_soft_tokens_per_image"][0])
        with torch.no_grad():
            features = model.model.get_image_features(
                inputs[key]["pixel_values"], inputs[key]["image_position_ids"], return_dict=True
            )
        out[f"embeds_{key}"] = features.pooler_output[0].numpy()
        assert len(out[f"embeds_{key}"]) == tokens[key] == rows * columns // V4_KERNEL**2
    rng = np.random.default_rng(40)

    def text(n: int) -> list[int]:
        return text_tokens(rng, n, BOI)

    def image(key: str) -> list[int]:
        return [BOI] + [IMAGE] * tokens[key] + [EOI]

    prompts = [
        (text(5) + image("a") + text(6), ["a"]),
        (text(3) + image("b") + text(2) + image("a") + text(4), ["b", "a"]),
    ]
    for i, (ids, keys) in enumerate(prompts):
        kwargs = {
            "pixel_values": torch.cat([inputs[k]["pixel_values"] for k in keys]),
            "image_position_ids": torch.cat([inputs[k]["image_position_ids"] for k in keys]),
            "mm_token_type_ids": (torch.tensor([ids]) == IMAGE).long(),
        }
        prompt_reference(model, i, ids, keys, out, **kwargs)
    np.savez(dest / REFERENCE_FILE, **out)
