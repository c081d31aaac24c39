"""atlas-model-nemotron-h: registration and serving defaults, the layer stack built from the config,
the config forms and aliases, and clear errors for configs and checkpoints that do not fit."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from atlas_model_nemotron_h.blocks import LatentMoE
from atlas_model_nemotron_h.config import NemotronHSpec

from atlas_core import LLM
from atlas_core.cli_plugins import add_plugins_parser
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.mamba2 import Mamba2Mixer
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.model.layers.relu2_mlp import SquaredReLUMLP
from atlas_core.parsing.registry import reasoning_parser_names, tool_parser_names
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import ReferenceParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


def test_registers_nemotron_h_with_serving_defaults() -> None:
    registration = load_plugins().get("model", "nemotron_h")
    assert registration.plugin.distribution == "atlas-model-nemotron-h"
    assert registration.metadata["architectures"] == ["NemotronHForCausalLM"]
    defaults = registration.metadata["defaults"]
    assert defaults == {"reasoning_parser": "qwen3", "tool_call_parser": "nemotron"}
    assert defaults["reasoning_parser"] in reasoning_parser_names()
    assert defaults["tool_call_parser"] in tool_parser_names()


def test_atlas_plugins_lists_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="atlas")
    add_plugins_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plugins", "--json"])
    assert args.handler(args) == 0
    plugins = {p["distribution"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
    entry = plugins["atlas-model-nemotron-h"]
    assert (entry["name"], entry["errors"]) == ("nemotron_h", [])
    assert [(r["kind"], r["name"], r["target"]) for r in entry["registrations"]] == [
        ("model", "nemotron_h", "atlas_model_nemotron_h.loader:NemotronHLoader")
    ]


def test_layer_stack_follows_the_pattern() -> None:
    llm = LLM(TINY / "nemotron_h")
    model = llm.loaded.model
    kinds = [type(layer.mixer) for layer in model.layers]
    assert kinds[0] is Mamba2Mixer and kinds[3] is Mamba2Mixer
    assert kinds[1] is MoEFeedForward and kinds[4] is SquaredReLUMLP
    assert model.layers[2].mixer.layer_index == 0  # the only attention layer holds KV cache slot 0
    assert len(model.kv_layouts) == 1
    assert sorted(model.recurrent_state.specs) == [0, 3]
    assert model.layers[1].mixer.correction_bias is not None
    assert llm.loaded.family_defaults["tool_call_parser"] == "nemotron"


def test_latent_moe_and_projection_biases() -> None:
    model = LLM(TINY / "nemotron_h_latent").loaded.model
    moe = model.layers[2].mixer
    assert isinstance(moe, LatentMoE) and moe.fc1_bias is not None and moe.moe.spec.num_groups == 2
    mamba = model.layers[0].mixer.weights
    assert mamba.in_proj_bias is not None and mamba.out_proj_bias is not None and mamba.conv_bias is not None


# ---- config forms --------------------------------------------------------------------------------
def fixture_config() -> dict[str, Any]:
    return json.loads((TINY / "nemotron_h" / "config.json").read_text())


def test_pattern_string_and_legacy_names_give_the_same_layers() -> None:
    config = fixture_config()
    from_list = NemotronHSpec.from_config(config)
    pattern = {k: v for k, v in config.items() if k != "layers_block_type"} | {"hybrid_override_pattern": "ME*M-"}
    legacy = config | {"layers_block_type": ["mamba", "moe", "attention", "mamba", "mlp"]}
    assert (
        NemotronHSpec.from_config(pattern).layer_kinds
        == from_list.layer_kinds
        == ("mamba", "moe", "attention", "mamba", "mlp")
    )
    assert NemotronHSpec.from_config(legacy).layer_kinds == from_list.layer_kinds


def test_original_mamba_aliases_and_time_step_limit_encodings() -> None:
    config = fixture_config()
    assert config["time_step_limit"] == [0.0, {"__float__": "Infinity"}]  # how transformers 5.23 writes infinity
    assert NemotronHSpec.from_config(config).mamba.dt_max == math.inf
    aliased = config | {"mamba_n_groups": 4, "mamba_d_conv": 3, "mamba_chunk_size": 8, "mamba_dt_limit": [0.01, 5]}
    mamba = NemotronHSpec.from_config(aliased).mamba
    assert (mamba.n_groups, mamba.conv_kernel, mamba.chunk_size, mamba.dt_min, mamba.dt_max) == (4, 3, 8, 0.01, 5.0)
    assert NemotronHSpec.from_config(config | {"time_step_limit": [0.0, math.inf]}).mamba.dt_max == math.inf


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"layers_block_type": None, "hybrid_override_pattern": "M*X"},
            r"unknown letters \['X'\] in hybrid_override_pattern",
        ),
        ({"layers_block_type": ["mamba", "conv"]}, r"unknown layer types \['conv'\]"),
        ({"layers_block_type": None}, "needs layers_block_type or hybrid_override_pattern"),
        ({"mlp_hidden_act": "silu"}, "mlp_hidden_act 'silu' is not supported"),
        ({"mamba_num_heads": 7}, r"num_heads \(7\) must be a multiple of n_groups \(2\)"),
        ({"time_step_limit": [0.5, 0.1]}, "must satisfy 0 <= min <= max"),
        ({"n_group": 3}, r"num_groups \(3\) must divide num_experts \(8\)"),
        ({"vocab_size": None}, "required key 'vocab_size' is missing"),
    ],
)
def test_bad_configs_are_refused_clearly(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        NemotronHSpec.from_config(fixture_config() | change, origin="config.json")


def test_checkpoint_that_does_not_fit_the_config_names_the_tensor(tmp_path: Path) -> None:
    folder = TINY.edited_copy(tmp_path, "nemotron_h", {"ssm_state_size": 32})
    expected = r"backbone\.layers\.0\.mixer\.in_proj\.weight has shape \(200, 64\).*implies \(264, 64\)"
    with pytest.raises(ModelLoadError, match=expected):
        LLM(folder)


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
