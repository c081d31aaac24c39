"""atlas-model-qwen3-next: registration and serving defaults, the checkpoint forms (fused / split GDN
projections, vision-language prefix, ``mtp.*`` heads), weight rearrangements and config errors.

Logit parity with transformers runs for every checkpoint in `TestReferenceParity`; the engine's
recurrent-state invariants in core's ``tests/test_engine_hybrid_state.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from atlas_model_qwen3_next.projections import gdn_in_proj_from_fused, split_gated_query
from safetensors.numpy import load_file, save_file

from atlas_core import LLM, SamplingParams
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.gated_delta_net import GatedDeltaNet, GatedDeltaNetShape
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import ReferenceParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize(
    ("model_type", "tool_parser"),
    [
        ("qwen3_next", "hermes"),
        ("qwen3_5", "qwen3_coder"),
        ("qwen3_5_text", "qwen3_coder"),
        ("qwen3_5_moe", "qwen3_coder"),
        ("qwen3_5_moe_text", "qwen3_coder"),
    ],
)
def test_registers_every_model_type_with_serving_defaults(model_type: str, tool_parser: str) -> None:
    registration = load_plugins().get("model", model_type)
    assert registration.plugin.distribution == "atlas-model-qwen3-next"
    assert registration.metadata["defaults"] == {"reasoning_parser": "qwen3", "tool_call_parser": tool_parser}


def test_layer_stack_of_each_fixture() -> None:
    """GDN and gated attention alternate; MoE where the config says (qwen3_next's layer 2 is dense);
    only the attention layers get KV; the recurrent state covers the GDN layers."""
    for name, moe_layers in (("qwen3_next", {0, 1, 3}), ("qwen3_5", set()), ("qwen3_5_moe", {0, 1, 2, 3})):
        model = LLM(TINY / name).loaded.model
        assert [type(layer.mixer).__name__ for layer in model.layers] == ["GatedDeltaNet", "GatedAttention"] * 2
        assert {i for i, layer in enumerate(model.layers) if isinstance(layer.ffn, MoEFeedForward)} == moe_layers
        assert len(model.kv_layouts) == 2
        assert model.recurrent_state is not None and sorted(model.recurrent_state.specs) == [0, 2]


def with_extra_tensors(src: Path, dest: Path, extra: dict[str, np.ndarray]) -> Path:
    shutil.copytree(src, dest)
    weights = load_file(dest / "model.safetensors")
    save_file({**weights, **extra}, dest / "model.safetensors")
    return dest


def test_mtp_heads_are_ignored(tmp_path: Path) -> None:
    """Multi-token-prediction weights (``mtp.*``, shipped with Qwen3-Next / Qwen3.5) do not change the model."""
    rng = np.random.default_rng(0)
    extra = {
        "mtp.fc.weight": rng.standard_normal((64, 128)).astype(np.float32),
        "mtp.layers.0.input_layernorm.weight": rng.standard_normal(64).astype(np.float32),
        "mtp.norm.weight": rng.standard_normal(64).astype(np.float32),
    }
    folder = with_extra_tensors(TINY / "qwen3_5", tmp_path / "with_mtp", extra)
    prompt = np.random.default_rng(1).integers(0, 256, 30).tolist()
    plain = LLM(TINY / "qwen3_5").generate(prompt, GREEDY)[0].outputs[0].token_ids
    assert LLM(folder).generate(prompt, GREEDY)[0].outputs[0].token_ids == plain


def test_vision_language_checkpoint_loads_the_text_stack() -> None:
    """The qwen3_5 fixture is a ``Qwen3_5ForConditionalGeneration`` save: text weights under
    ``model.language_model.*`` beside a vision tower that is not loaded."""
    config = json.loads((TINY / "qwen3_5" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and "text_config" in config
    llm = LLM(TINY / "qwen3_5")
    assert llm.loaded.model.vocab_size == config["text_config"]["vocab_size"]


def test_split_gated_query_takes_per_head_halves() -> None:
    heads, dim, hidden = 3, 4, 2
    q_proj = np.arange(heads * 2 * dim * hidden).reshape(heads * 2 * dim, hidden)
    query, gate = split_gated_query(q_proj, heads, dim)
    for h in range(heads):
        np.testing.assert_array_equal(query[h * dim : (h + 1) * dim], q_proj[2 * h * dim : (2 * h + 1) * dim])
        np.testing.assert_array_equal(gate[h * dim : (h + 1) * dim], q_proj[(2 * h + 1) * dim : (2 * h + 2) * dim])
    bias_query, bias_gate = split_gated_query(np.arange(heads * 2 * dim), heads, dim)
    np.testing.assert_array_equal(bias_query, query[:, 0] // hidden)
    np.testing.assert_array_equal(bias_gate, gate[:, 0] // hidden)
    with pytest.raises(ValueError, match="num_attention_heads"):
        split_gated_query(q_proj[:-1], heads, dim)


def test_fused_projections_regroup_by_value_head() -> None:
    """Row by row: value head ``h * r + j`` (r value heads per key head) comes from key head h's group."""
    shape = GatedDeltaNetShape(
        num_key_heads=2, num_value_heads=6, key_head_dim=2, value_head_dim=3, conv_kernel=4, norm_eps=1e-6
    )
    r, dk, dv = 3, 2, 3
    group = 2 * dk + 2 * r * dv
    qkvz = np.arange(2 * group)[:, None] * np.ones((1, 5))
    ba = 1000 + np.arange(2 * 2 * r)[:, None] * np.ones((1, 5))
    rows = gdn_in_proj_from_fused(qkvz, ba, shape)[:, 0].astype(int).tolist()
    expected_q = [h * group + i for h in range(2) for i in range(dk)]
    expected_k = [h * group + dk + i for h in range(2) for i in range(dk)]
    expected_v = [h * group + 2 * dk + j * dv + i for h in range(2) for j in range(r) for i in range(dv)]
    expected_z = [h * group + 2 * dk + r * dv + j * dv + i for h in range(2) for j in range(r) for i in range(dv)]
    expected_b = [1000 + h * 2 * r + j for h in range(2) for j in range(r)]
    expected_a = [1000 + h * 2 * r + r + j for h in range(2) for j in range(r)]
    assert rows == expected_q + expected_k + expected_v + expected_z + expected_b + expected_a
    assert len(rows) == shape.projection_rows
    with pytest.raises(ValueError, match="in_proj_qkvz"):
        gdn_in_proj_from_fused(qkvz[:-1], ba, shape)


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        (
            "qwen3_next",
            {"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
            "sliding_attention",
        ),
        ("qwen3_next", {"layer_types": ["linear_attention", "full_attention"]}, "lists 2 layers"),
        ("qwen3_next", {"linear_num_value_heads": 3}, "multiple of"),
        ("qwen3_next", {"linear_value_head_dim": 16}, r"in_proj_qkvz.weight: .* do not fit"),
        (
            "qwen3_5_moe",
            {"linear_value_head_dim": 16},
            r"input projections has shape \(136, 64\), but config.json implies \(200, 64\)",
        ),
        ("qwen3_5_moe", {"head_dim": 8}, r"q_proj.weight: .* num_attention_heads"),
    ],
)
def test_config_errors_name_the_problem(tmp_path: Path, name: str, changes: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        LLM(TINY.edited_copy(tmp_path, name, changes))


def test_full_attention_interval_replaces_layer_types(tmp_path: Path) -> None:
    """Configs without ``layer_types`` place full attention every ``full_attention_interval`` layers."""
    config = json.loads((TINY / "qwen3_next" / "config.json").read_text())
    folder = TINY.edited_copy(
        tmp_path, "qwen3_next", {"full_attention_interval": 2}, edit=lambda c: c.pop("layer_types")
    )
    prompt = np.random.default_rng(2).integers(0, 256, 20).tolist()
    assert config["layer_types"] == ["linear_attention", "full_attention"] * 2
    model = LLM(folder).loaded.model
    assert [isinstance(layer.mixer, GatedDeltaNet) for layer in model.layers] == [True, False, True, False]
    assert (
        LLM(folder).generate(prompt, GREEDY)[0].outputs[0].token_ids
        == LLM(TINY / "qwen3_next").generate(prompt, GREEDY)[0].outputs[0].token_ids
    )


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
