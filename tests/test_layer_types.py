"""The TransformerLayer plug point for core's layer types: every registered name imports, and every
family builds the core layers it uses through `ModelWeightLoader.layer_type`, so the class found
under a name is the one that runs (a plugin supplies another class under its own name, and a
family subclass asks for it, as the example plugin does for ``rms_norm``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from PIL import Image

from atlas_core import LLM, SamplingParams
from atlas_core.builtin_plugin import CORE_LAYERS
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.plugins import load_plugins
from tests.conftest import TINY

FAMILY_LAYERS = {
    "llama": {"rms_norm", "attention", "swiglu_mlp", "pre_norm_decoder_layer"},
    "qwen3_moe": {"rms_norm", "attention", "swiglu_mlp", "moe", "routed_experts", "pre_norm_decoder_layer"},
    "minimax_m2": {"rms_norm", "attention", "moe", "routed_experts", "pre_norm_decoder_layer"},
    "deepseek_v3": {"rms_norm", "mla", "swiglu_mlp", "moe", "routed_experts", "pre_norm_decoder_layer"},
    "gemma3": {"rms_norm", "attention", "geglu_mlp", "sandwich_decoder_layer"},
    "gemma3_vl": {
        "rms_norm",
        "attention",
        "geglu_mlp",
        "sandwich_decoder_layer",
        "siglip_encoder_layer",
        "gemma3_multimodal_projector",
    },
    "gemma4": {
        "rms_norm",
        "attention",
        "shared_kv_attention",
        "geglu_mlp",
        "sandwich_decoder_layer",
        "per_layer_inputs",
        "per_layer_input_gate",
    },
    "gemma4_moe": {"rms_norm", "attention", "geglu_mlp", "moe", "routed_experts"},
    "gemma4_vl": {
        "rms_norm",
        "attention",
        "geglu_mlp",
        "sandwich_decoder_layer",
        "per_layer_inputs",
        "per_layer_input_gate",
        "gemma4_vision_encoder_layer",
        "gemma4_multimodal_embedder",
    },
    "qwen3_next": {
        "rms_norm",
        "gated_delta_net",
        "gated_attention",
        "swiglu_mlp",
        "moe",
        "routed_experts",
        "pre_norm_decoder_layer",
    },
    "nemotron_h": {"rms_norm", "mamba2", "attention", "relu2_mlp", "moe", "routed_experts"},
    "qwen3_vl": {
        "rms_norm",
        "attention",
        "swiglu_mlp",
        "pre_norm_decoder_layer",
        "vision_block",
        "qwen3_vl_patch_merger",
    },
}
"""The layer types each family's tiny fixture is built from."""


def test_every_core_layer_type_is_registered_and_imports() -> None:
    registry = load_plugins()
    for name, target in CORE_LAYERS.items():
        registration = registry.get("layer", name)
        assert (registration.target, registration.plugin.distribution) == (target, "atlas-core")
        assert isinstance(registration.load(), type), name


def test_the_families_cover_every_registered_layer_type() -> None:
    """Core's layer types and the family plugins' own (Gemma's per-layer inputs, sandwich layer and Gemma 3
    / 4 vision layers, Qwen3-VL's patch merger)."""
    registry = load_plugins()
    shipped = {
        r.name
        for r in registry.registrations("layer")
        if r.plugin.distribution.startswith(("atlas-core", "atlas-model-"))
    }
    assert set().union(*FAMILY_LAYERS.values()) == shipped


@pytest.mark.parametrize(("fixture", "expected"), FAMILY_LAYERS.items(), ids=list(FAMILY_LAYERS))
def test_family_runs_the_layer_classes_it_looked_up(
    monkeypatch: pytest.MonkeyPatch, fixture: str, expected: set[str]
) -> None:
    """Every layer type is swapped for a subclass counting its calls: the family asks for exactly the
    expected names, and each class it got runs while generating."""
    calls: Counter[str] = Counter()
    lookup = ModelWeightLoader.layer_type

    def counting_layer_type(loader: ModelWeightLoader, name: str) -> Any:
        layer_class = lookup(loader, name)

        def counting_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return layer_class.__call__(self, *args, **kwargs)

        return type(f"Counting{layer_class.__name__}", (layer_class,), {"__call__": counting_call})

    monkeypatch.setattr(ModelWeightLoader, "layer_type", counting_layer_type)
    llm = LLM(TINY / fixture, backend="numpy")
    prompt = np.random.default_rng(0).integers(0, min(llm.loaded.model.vocab_size, 200), 12).tolist()
    vision = llm.loaded.model.vision
    images = []
    if vision is not None:  # a vision-language fixture: with one of its images, so the tower's layers run too
        prompt.append(vision.image_token_id)
        images.append(Image.open(TINY / fixture / "image_a.png"))
    llm.generate(
        {"prompt_token_ids": prompt, "images": images}, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    )
    assert set(calls) == expected
