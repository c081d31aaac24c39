"""atlas-model-gemma: registration and serving defaults, how the configs map onto layers (windows,
KV sharing, per-layer head shapes), the text stack of vision-language checkpoints, the Hub's older
config keys, clear refusals, and logit parity on every checkpoint (`TestReferenceParity`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from atlas_model_gemma.config import parse
from safetensors.numpy import load_file, save_file

from atlas_core import LLM
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import SharedKVAttention
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.cli import by_distribution, run_plugins
from atlas_core.testing.parity import TOLERANCE, ReferenceParity, max_prompt_logprob_error

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


def assert_matches_reference(folder: Path, fixture: str) -> None:
    """The checkpoint in ``folder`` gives fixture ``fixture``'s reference log-probs at every prompt position."""
    assert max_prompt_logprob_error(LLM(folder, backend="numpy"), TINY.reference(fixture)) <= TOLERANCE, folder.name


def rewrite(fixture: str, folder: Path, config: dict[str, Any], rename: Any = None) -> Path:
    """A copy of ``fixture`` in ``folder`` with ``config`` as its config.json and tensor names mapped by ``rename``."""
    folder.mkdir()
    tensors = load_file(TINY / fixture / "model.safetensors")
    if rename is not None:
        tensors = {rename(name): value for name, value in tensors.items()}
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def config_of(fixture: str) -> dict[str, Any]:
    return json.loads((TINY / fixture / "config.json").read_text())


# ---- registration ---------------------------------------------------------------------------------
def test_registers_every_gemma_model_type_with_serving_defaults() -> None:
    registry = load_plugins()
    for model_type, defaults in [
        ("gemma3_text", {"reasoning_parser": None, "tool_call_parser": "json"}),
        ("gemma3", {"reasoning_parser": None, "tool_call_parser": "json"}),
        ("gemma4_text", {"reasoning_parser": "gemma4", "tool_call_parser": "gemma4"}),
        ("gemma4", {"reasoning_parser": "gemma4", "tool_call_parser": "gemma4"}),
    ]:
        registration = registry.get("model", model_type)
        assert registration.plugin.distribution == "atlas-model-gemma"
        assert registration.metadata["defaults"] == defaults


def test_atlas_plugins_lists_the_family_and_imports_its_loaders(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = by_distribution(json.loads(run_plugins(capsys, "--check", "--json")))["atlas-model-gemma"]
    assert plugin["errors"] == []
    registrations = {(r["kind"], r["name"]): r for r in plugin["registrations"]}
    assert sorted(name for kind, name in registrations if kind == "model") == [
        "gemma3",
        "gemma3_text",
        "gemma4",
        "gemma4_text",
    ]
    assert sorted(name for kind, name in registrations if kind == "layer") == [
        "gemma3_multimodal_projector",
        "gemma4_multimodal_embedder",
        "gemma4_vision_encoder_layer",
        "per_layer_input_gate",
        "per_layer_inputs",
        "sandwich_decoder_layer",
        "siglip_encoder_layer",
    ]
    assert ("op_group", "gemma") in registrations
    assert {r["check"]["status"] for r in registrations.values()} == {"ok"}


# ---- layer composition ----------------------------------------------------------------------------
def test_gemma3_layers_follow_layer_types() -> None:
    model = LLM(TINY / "gemma3", backend="numpy").loaded.model
    windows = [layer.mixer.sliding_window for layer in model.layers]
    assert windows == [8, 8, None, 8]
    assert [layer.mixer.scale for layer in model.layers] == [24**-0.5] * 4  # query_pre_attn_scalar, not head_dim
    assert len(model.kv_layouts) == 4


def test_gemma4_kv_sharing_and_per_layer_head_shapes() -> None:
    model = LLM(TINY / "gemma4", backend="numpy").loaded.model
    mixers = [layer.block.mixer for layer in model.layers]
    assert [m.sliding_window for m in mixers] == [8, 8, None, 8, None]
    assert [(m.head_dim, m.num_kv_heads) for m in mixers] == [(16, 2), (16, 2), (32, 1), (16, 2), (32, 1)]
    # layers 3 and 4 read the caches of the last earlier layer of their type; only 3 layers own a cache
    assert [isinstance(m, SharedKVAttention) for m in mixers] == [False, False, False, True, True]
    assert [m.layer_index for m in mixers] == [0, 1, 2, 1, 2]
    assert [(layout.num_kv_heads, layout.head_dim) for layout in model.kv_layouts] == [(2, 16), (2, 16), (1, 32)]
    assert mixers[2].weights.values_from_keys and not mixers[0].weights.values_from_keys
    assert [layer.layer_scalar for layer in model.layers] == pytest.approx([0.6, 0.75, 0.9, 1.05, 1.2])


# ---- vision-language checkpoints and older config keys -------------------------------------------
def test_gemma3_text_stack_under_model_language_model(tmp_path: Path) -> None:
    """transformers saves Gemma 3 vision-language checkpoints with ``language_model.model.*`` (the
    fixture); the Hub's newer uploads use ``model.language_model.*``: both load."""
    folder = rewrite(
        "gemma3_multimodal",
        tmp_path / "renamed",
        config_of("gemma3_multimodal"),
        lambda name: name.replace("language_model.model.", "model.language_model.", 1),
    )
    assert_matches_reference(folder, "gemma3_multimodal")


def test_gemma4_vision_language_checkpoint_loads_its_text_stack(tmp_path: Path) -> None:
    """The gemma4 fixture re-saved the way Gemma4ForConditionalGeneration checkpoints are laid out:
    ``model_type`` gemma4, the text config under ``text_config``, weights under ``model.language_model.``
    beside audio weights that are not read (and no vision tower: see test_gemma4_vision for one); the logits
    are the text model's."""
    text = config_of("gemma4")
    config = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16},
        "tie_word_embeddings": True,
    }
    folder = rewrite(
        "gemma4", tmp_path / "multimodal", config, lambda name: "model.language_model." + name.removeprefix("model.")
    )
    audio = {"model.audio_tower.output_proj.weight": np.ones((16, 12), dtype=np.float32)}
    save_file(load_file(folder / "model.safetensors") | audio, folder / "model.safetensors")
    assert_matches_reference(folder, "gemma4")


def test_gemma3_hub_style_rope_and_pattern_keys(tmp_path: Path) -> None:
    """Hub Gemma 3 configs predate ``rope_parameters`` / ``layer_types``: ``rope_theta`` (global layers),
    ``rope_local_base_freq`` (sliding layers), ``rope_scaling`` (global only), ``sliding_window_pattern``."""
    config = config_of("gemma3")
    for key in ("rope_parameters", "layer_types"):
        del config[key]
    config |= {
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "sliding_window_pattern": 3,
    }
    assert_matches_reference(rewrite("gemma3", tmp_path / "hub", config), "gemma3")


def test_gemma4_hub_style_global_head_keys(tmp_path: Path) -> None:
    """Hub Gemma 4 configs give the full-attention head shape as ``global_head_dim`` /
    ``num_global_key_value_heads`` instead of transformers 5's ``per_layer_config``."""
    config = config_of("gemma4")
    del config["per_layer_config"]
    config |= {"global_head_dim": 32, "num_global_key_value_heads": 1}
    assert_matches_reference(rewrite("gemma4", tmp_path / "hub", config), "gemma4")


def test_sparse_vision_language_config_takes_transformers_defaults() -> None:
    """Hub Gemma 3 vision-language configs list only a few text keys; the rest are transformers' defaults."""
    config = {
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    }
    spec = parse(config, "gemma3", "config.json")
    assert (spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]) == (8, 4, 256)
    assert spec.attention_scale == 256**-0.5 and spec.tie_word_embeddings
    assert [layer.sliding_window for layer in spec.layers[:6]] == [1024] * 5 + [None]
    full, sliding = spec.layers[5].rope, spec.layers[0].rope
    assert (full.rope_type, full.theta, full.scaling["factor"]) == ("linear", 1_000_000.0, 8.0)
    assert (sliding.rope_type, sliding.theta) == ("default", 10_000.0)


# ---- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fixture", "value"), [("gemma3", True), ("gemma4", "all")])
def test_bidirectional_checkpoints_are_refused(tmp_path: Path, fixture: str, value: Any) -> None:
    folder = TINY.edited_copy(tmp_path, fixture, {"use_bidirectional_attention": value})
    with pytest.raises(ModelLoadError, match="use_bidirectional_attention.*causal decoders only"):
        LLM(folder, backend="numpy")


def test_kv_sharing_without_a_producer_of_that_type_is_refused() -> None:
    config = config_of("gemma4") | {"layer_types": ["full_attention"] * 3 + ["sliding_attention", "full_attention"]}
    with pytest.raises(ModelLoadError, match="KV-shared layer 3 .* has no earlier sliding_attention layer"):
        parse(config | {"num_kv_shared_layers": 2, "per_layer_config": {}}, "gemma4", "config.json")


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
