"""Loading Gemma 4's vision side (`attach_gemma4_vision`) and describing its tensors (`gemma4_vision_shapes`).

A ``gemma4`` checkpoint (``Gemma4ForConditionalGeneration``) holds the vision tower under
``model.vision_tower.`` and its multimodal embedder under ``model.embed_vision.`` (or both without
``model.``) beside the text stack. Its audio tower (``audio_tower.`` / ``embed_audio.``) is not read: the
model takes text and images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.vision import Linear
from atlas_core.model.loader import ModelWeightLoader
from atlas_model_gemma.gemma4_image_processor import Gemma4ImageProcessor
from atlas_model_gemma.gemma4_tower import ClippableLinear, Gemma4VisionTower, axial_permutation
from atlas_model_gemma.vision import Gemma4Vision

TOWER_PREFIXES = ("model.vision_tower.", "vision_tower.")
EMBEDDER_PREFIXES = ("model.embed_vision.", "embed_vision.")
TOWER_ANCHOR = "patch_embedder.input_proj.weight"
SAVED_TOWER, SAVED_EMBEDDER = TOWER_PREFIXES[0], EMBEDDER_PREFIXES[0]
"""Where transformers 5 saves them (the layout `gemma4_vision_shapes` describes)."""

VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    "pooling_kernel_size": 3,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
    "use_clipped_linears": False,
    "standardize": False,
}
"""transformers' ``Gemma4VisionConfig`` defaults, for keys a checkpoint's ``vision_config`` leaves out."""
TOKEN_DEFAULTS = {"image_token_id": 258_880, "boi_token_id": 255_999, "eoi_token_id": 258_882}
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")


def vision_config(config: dict[str, Any], origin: str) -> dict[str, Any]:
    """The ``vision_config`` with transformers' defaults filled in; `ModelLoadError` naming ``origin``'s
    config.json when the tower uses something not implemented here."""
    given = config.get("vision_config") or {}
    vision = VISION_DEFAULTS | {k: v for k, v in given.items() if v is not None}
    where = f"{origin}/config.json: vision_config"
    if vision["hidden_activation"] not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"{where} hidden_activation {vision['hidden_activation']!r} is not supported")
    rope = vision["rope_parameters"] or {}
    if rope.get("rope_type", "axial") != "axial":
        raise ModelLoadError(f"{where} rope_type {rope.get('rope_type')!r} is not supported (axial only)")
    if int(vision["num_key_value_heads"]) != int(vision["num_attention_heads"]):
        raise ModelLoadError(
            f"{where} num_key_value_heads {vision['num_key_value_heads']} must equal num_attention_heads "
            f"{vision['num_attention_heads']} (grouped-query attention in the tower is not supported)"
        )
    if int(vision["head_dim"]) % 4:
        raise ModelLoadError(f"{where} head_dim {vision['head_dim']} must be a multiple of 4 (2-D rotary)")
    return vision


def has_tower(loader: ModelWeightLoader) -> bool:
    """Whether ``loader``'s checkpoint holds the vision tower."""
    return any(prefix + TOWER_ANCHOR in loader.source for prefix in TOWER_PREFIXES)


def attach_gemma4_vision(loader: ModelWeightLoader, text: dict[str, Any]) -> Gemma4Vision:
    """The vision side of ``loader``'s ``gemma4`` checkpoint (its ``vision_config``, image token ids,
    ``preprocessor_config.json`` and the text config ``text``'s ``use_bidirectional_attention``)."""
    config, origin = loader.source.config, loader.origin
    vision = vision_config(config, origin)
    tokens = TOKEN_DEFAULTS | {key: int(config[key]) for key in TOKEN_DEFAULTS if config.get(key) is not None}
    return Gemma4Vision(
        Gemma4ImageProcessor.from_folder(Path(origin), vision),
        load_tower(loader, vision),
        tokens["image_token_id"],
        tokens["boi_token_id"],
        tokens["eoi_token_id"],
        bidirectional_images=text.get("use_bidirectional_attention") == "vision",
    )


def load_tower(loader: ModelWeightLoader, vision: dict[str, Any]) -> Gemma4VisionTower:
    """The tower and embedder, built from the registered ``gemma4_vision_encoder_layer`` and
    ``gemma4_multimodal_embedder`` layers."""
    backend = loader.backend
    p = loader.find_prefix(TOWER_PREFIXES, TOWER_ANCHOR)
    e = loader.find_prefix(EMBEDDER_PREFIXES, "embedding_projection.weight")
    eps, dim, heads = float(vision["rms_norm_eps"]), int(vision["head_dim"]), int(vision["num_attention_heads"])
    clipped = bool(vision["use_clipped_linears"])
    order = (np.arange(heads)[:, None] * dim + axial_permutation(dim)[None, :]).reshape(-1)

    def linear(name: str, rows: np.ndarray | None = None) -> ClippableLinear:
        weight = loader.tensor(name + ".linear.weight")
        layer = Linear(backend, loader.upload_arrays(weight if rows is None else weight[rows]), None)
        if not clipped:
            return ClippableLinear(backend, layer)
        bounds = tuple(float(loader.tensor(f"{name}.{bound}").reshape(-1)[0]) for bound in CLIP_BOUNDS)
        return ClippableLinear(backend, layer, None if all(np.isinf(bounds)) else bounds)  # type: ignore[arg-type]

    def norm(name: str, rows: np.ndarray | None = None) -> Any:
        if rows is None:
            return loader.rms_norm(name + ".weight", eps)
        weight = backend.from_numpy(loader.tensor(name + ".weight")[rows], weight=True)
        return loader.layer_type("rms_norm")(backend, weight, eps)

    unit = loader.layer_type("rms_norm")(backend, backend.from_numpy(np.ones(dim, np.float32), weight=True), eps)
    layer_type = loader.layer_type("gemma4_vision_encoder_layer")
    layers = []
    for i in range(int(vision["num_hidden_layers"])):
        a = f"{p}encoder.layers.{i}."
        rotated = ("self_attn.q_proj", "self_attn.k_proj")  # rows reordered for the rotary (gemma4_tower)
        q, k, v, o = (linear(a + name, order if name in rotated else None) for name in PROJECTIONS)
        gate, up, down = (linear(a + name) for name in MLP)
        input_norm, post_attention, pre_ffn, post_ffn = (norm(a + name) for name in NORMS)
        layers.append(
            layer_type(
                backend=backend,
                input_norm=input_norm,
                q=q,
                k=k,
                v=v,
                o=o,
                q_norm=norm(a + "self_attn.q_norm", order[:dim]),
                k_norm=norm(a + "self_attn.k_norm", order[:dim]),
                v_norm=unit,
                post_attention_norm=post_attention,
                pre_ffn_norm=pre_ffn,
                gate=gate,
                up=up,
                down=down,
                post_ffn_norm=post_ffn,
                head_dim=dim,
            )
        )
    width = int(vision["hidden_size"])
    table = loader.tensor(p + "patch_embedder.position_embedding_table")
    standardize = None
    if vision["standardize"]:
        standardize = (loader.upload(p + "std_bias"), loader.upload(p + "std_scale"))
    embedder = loader.layer_type("gemma4_multimodal_embedder")(
        backend,
        loader.layer_type("rms_norm")(backend, backend.from_numpy(np.ones(width, np.float32), weight=True), eps),
        Linear(backend, loader.upload(e + "embedding_projection.weight"), None),
    )
    return Gemma4VisionTower(
        backend,
        Linear(backend, loader.upload(p + TOWER_ANCHOR), None),
        loader.upload_arrays(np.ascontiguousarray(table[0])),
        loader.upload_arrays(np.ascontiguousarray(table[1])),
        layers,
        int(vision["pooling_kernel_size"]),
        dim,
        float((vision["rope_parameters"] or {}).get("rope_theta", 100.0)),
        standardize,
        embedder,
    )


def gemma4_vision_shapes(config: dict[str, Any], text_width: int) -> dict[str, tuple[int, ...]]:
    """Every tensor `attach_gemma4_vision` reads from a ``gemma4`` checkpoint with ``config`` (text width
    ``text_width``), by the names transformers 5 saves."""
    vision = vision_config(config, "")
    p, width, inter = SAVED_TOWER, int(vision["hidden_size"]), int(vision["intermediate_size"])
    inner, patch = int(vision["num_attention_heads"]) * int(vision["head_dim"]), int(vision["patch_size"])
    shapes: dict[str, tuple[int, ...]] = {
        p + TOWER_ANCHOR: (width, 3 * patch * patch),
        p + "patch_embedder.position_embedding_table": (2, int(vision["position_embedding_size"]), width),
        SAVED_EMBEDDER + "embedding_projection.weight": (text_width, width),
    }
    if vision["standardize"]:
        shapes |= {p + "std_bias": (width,), p + "std_scale": (width,)}
    for i in range(int(vision["num_hidden_layers"])):
        a = f"{p}encoder.layers.{i}."
        sizes = dict(
            zip(
                PROJECTIONS + MLP,
                [(inner, width)] * 3 + [(width, inner), (inter, width), (inter, width), (width, inter)],
                strict=True,
            )
        )
        for name, size in sizes.items():
            shapes[a + name + ".linear.weight"] = size
            if vision["use_clipped_linears"]:
                shapes |= {f"{a}{name}.{bound}": () for bound in CLIP_BOUNDS}
        shapes |= {a + name + ".weight": (width,) for name in NORMS}
        shapes |= {a + f"self_attn.{n}_norm.weight": (int(vision["head_dim"]),) for n in "qk"}
    return shapes
