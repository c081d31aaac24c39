"""Loading Gemma 3's vision side (`attach_vision`) and describing its tensors (`vision_shapes`).

A ``gemma3`` checkpoint (``Gemma3ForConditionalGeneration``) holds the SigLIP tower and the projector
beside the text stack, under one of the prefixes transformers has used: the tower under
``model.vision_tower.vision_model.`` (saved by transformers 4.52 - 4.x), ``vision_tower.vision_model.``
(the Hub's first uploads) or ``vision_tower.`` / ``model.vision_tower.`` (saved by transformers 5), the
projector under ``model.multi_modal_projector.`` or ``multi_modal_projector.``. SigLIP's attention-pooling
head (``head.*``, present when ``vision_use_head``) is not used by Gemma 3 and not read.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.vision import LayerNorm, Linear
from atlas_core.model.loader import ModelWeightLoader
from atlas_model_gemma.image_processor import Gemma3ImageProcessor
from atlas_model_gemma.siglip import SiglipTower
from atlas_model_gemma.vision import Gemma3Vision

log = logging.getLogger("atlas.models.gemma")

TOWER_PREFIXES = (
    "model.vision_tower.vision_model.",
    "vision_tower.vision_model.",
    "model.vision_tower.",
    "vision_tower.",
)
PROJECTOR_PREFIXES = ("model.multi_modal_projector.", "multi_modal_projector.")
TOWER_ANCHOR = "embeddings.patch_embedding.weight"
SAVED_TOWER, SAVED_PROJECTOR = "vision_tower.", "multi_modal_projector."
"""Where transformers 5 saves them (the layout `vision_shapes` describes)."""

SIGLIP_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
"""transformers' ``SiglipVisionConfig`` defaults, for keys a checkpoint's ``vision_config`` leaves out."""
GEMMA3_DEFAULTS = {"mm_tokens_per_image": 256, "boi_token_index": 255_999, "eoi_token_index": 256_000}
IMAGE_TOKEN_INDEX = 262_144


def vision_config(config: dict[str, Any]) -> dict[str, Any]:
    """The ``vision_config`` with SigLIP's defaults filled in."""
    given = config.get("vision_config") or {}
    return SIGLIP_DEFAULTS | {k: v for k, v in given.items() if v is not None}


def pooling(config: dict[str, Any], origin: str) -> tuple[int, int, int]:
    """``(patches per side, pooling kernel, tokens per image)``; `ModelLoadError` unless ``mm_tokens_per_image``
    is a square whose side divides the patch grid's (the projector pools whole ``kernel x kernel`` blocks)."""
    vision = vision_config(config)
    side = int(vision["image_size"]) // int(vision["patch_size"])
    tokens = int(config.get("mm_tokens_per_image") or GEMMA3_DEFAULTS["mm_tokens_per_image"])
    per_side = round(tokens**0.5)
    if per_side * per_side != tokens or side % per_side:
        raise ModelLoadError(
            f"{origin}/config.json: mm_tokens_per_image {tokens} must be a square whose side divides the "
            f"{side} x {side} patch grid (image_size / patch_size)"
        )
    return side, side // per_side, tokens


def has_tower(loader: ModelWeightLoader) -> bool:
    """Whether ``loader``'s checkpoint holds the vision tower."""
    return any(prefix + TOWER_ANCHOR in loader.source for prefix in TOWER_PREFIXES)


def image_token(config: dict[str, Any], vocab_size: int) -> int | None:
    """The config's ``image_token_index`` when it is a row of the ``vocab_size``-row embedding table (as in
    Gemma 3's checkpoints: 262144 of 262208), else None: the engine embeds the placeholder tokens before
    their rows take the image features, so a model whose image token is outside the table reads text only
    (transformers embeds such tokens as token 0 instead)."""
    token = int(config.get("image_token_index", IMAGE_TOKEN_INDEX))
    return token if 0 <= token < vocab_size else None


def attach_vision(loader: ModelWeightLoader, vocab_size: int) -> Gemma3Vision | None:
    """The vision side of ``loader``'s ``gemma3`` checkpoint (its ``vision_config``, ``mm_tokens_per_image``,
    image token ids and ``preprocessor_config.json``), whose text embedding has ``vocab_size`` rows. None,
    with a warning, when the image token is outside the embedding table (`image_token`); `ModelLoadError`
    naming the file when the settings do not fit the tower."""
    config, origin = loader.source.config, loader.origin
    token = image_token(config, vocab_size)
    if token is None:
        log.warning(
            "%s/config.json: image_token_index %s is outside the %d-row embedding table; the model reads text only",
            origin,
            config.get("image_token_index"),
            vocab_size,
        )
        return None
    vision = vision_config(config)
    _, _, tokens = pooling(config, origin)
    return Gemma3Vision(
        Gemma3ImageProcessor.from_folder(Path(origin), vision, tokens),
        load_tower(loader),
        token,
        int(config.get("boi_token_index", GEMMA3_DEFAULTS["boi_token_index"])),
        int(config.get("eoi_token_index", GEMMA3_DEFAULTS["eoi_token_index"])),
    )


def load_tower(loader: ModelWeightLoader) -> SiglipTower:
    """The SigLIP tower and projector, built from the registered ``siglip_encoder_layer`` and
    ``gemma3_multimodal_projector`` layers."""
    config, backend, origin = loader.source.config, loader.backend, loader.origin
    vision = vision_config(config)
    if vision["hidden_act"] not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"{origin}/config.json: vision hidden_act {vision['hidden_act']!r} is not supported")
    p = loader.find_prefix(TOWER_PREFIXES, TOWER_ANCHOR)
    m = loader.find_prefix(PROJECTOR_PREFIXES, "mm_input_projection_weight")
    eps, heads = float(vision["layer_norm_eps"]), int(vision["num_attention_heads"])
    side, kernel, _ = pooling(config, origin)

    def linear(name: str) -> Linear:
        return Linear(backend, loader.upload(name + ".weight"), loader.upload(name + ".bias"))

    def norm(name: str) -> LayerNorm:
        return LayerNorm(backend, loader.upload(name + ".weight"), loader.upload(name + ".bias"), eps)

    layer_type = loader.layer_type("siglip_encoder_layer")
    layers = []
    for i in range(int(vision["num_hidden_layers"])):
        a = f"{p}encoder.layers.{i}."
        qkv = [f"{a}self_attn.{n}_proj" for n in "qkv"]
        layers.append(
            layer_type(
                backend,
                norm(a + "layer_norm1"),
                Linear(
                    backend, loader.upload(*(n + ".weight" for n in qkv)), loader.upload(*(n + ".bias" for n in qkv))
                ),
                linear(a + "self_attn.out_proj"),
                norm(a + "layer_norm2"),
                linear(a + "mlp.fc1"),
                linear(a + "mlp.fc2"),
                heads,
            )
        )
    patch = loader.tensor(p + "embeddings.patch_embedding.weight")
    projection = loader.tensor(m + "mm_input_projection_weight")  # [C, H]: x @ w
    projector = loader.layer_type("gemma3_multimodal_projector")(
        backend,
        loader.rms_norm(m + "mm_soft_emb_norm.weight", eps, zero_centred=True),
        Linear(backend, loader.upload_arrays(projection.T.copy()), None),
        side,
        kernel,
    )
    return SiglipTower(
        backend,
        Linear(
            backend,
            loader.upload_arrays(patch.reshape(patch.shape[0], -1)),
            loader.upload(p + "embeddings.patch_embedding.bias"),
        ),
        loader.upload(p + "embeddings.position_embedding.weight"),
        layers,
        norm(p + "post_layernorm"),
        projector,
        int(vision["patch_size"]),
    )


def vision_shapes(config: dict[str, Any], text_width: int) -> dict[str, tuple[int, ...]]:
    """Every tensor `attach_vision` reads from a ``gemma3`` checkpoint with ``config`` (text width
    ``text_width``), by the names transformers 5 saves."""
    vision = vision_config(config)
    p, width, inter = SAVED_TOWER, int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch, side = int(vision["patch_size"]), int(vision["image_size"]) // int(vision["patch_size"])
    shapes: dict[str, tuple[int, ...]] = {
        p + "embeddings.patch_embedding.weight": (width, int(vision["num_channels"]), patch, patch),
        p + "embeddings.patch_embedding.bias": (width,),
        p + "embeddings.position_embedding.weight": (side * side, width),
        SAVED_PROJECTOR + "mm_input_projection_weight": (width, text_width),
        SAVED_PROJECTOR + "mm_soft_emb_norm.weight": (width,),
    }
    shapes |= {p + "post_layernorm.weight": (width,), p + "post_layernorm.bias": (width,)}
    for i in range(int(vision["num_hidden_layers"])):
        a = f"{p}encoder.layers.{i}."
        for name, rows, columns in [
            *((f"self_attn.{n}_proj", width, width) for n in ("q", "k", "v", "out")),
            ("mlp.fc1", inter, width),
            ("mlp.fc2", width, inter),
        ]:
            shapes |= {a + name + ".weight": (rows, columns), a + name + ".bias": (rows,)}
        shapes |= {a + f"layer_norm{j}.{kind}": (width,) for j in (1, 2) for kind in ("weight", "bias")}
    return shapes
