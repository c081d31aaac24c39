"""atlas-model-minimax: registration, full-width q/k norms, partial rotary (also from the legacy
``rotary_dim`` key), the selection-only correction bias, batch invariance and bad checkpoints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from atlas_model_minimax.loader import AllHeadsRMSNorm
from safetensors.numpy import load_file, save_file

from atlas_core import LLM
from atlas_core.backends.ops.moe import MoEOps
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.cli import run_plugins
from atlas_core.testing.family import INVARIANCE_SETTINGS, assert_batch_invariant, greedy_alone
from atlas_core.testing.parity import TOLERANCE, ReferenceParity, max_prompt_logprob_error

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
FIXTURE = TINY / "minimax_m2"


def moe_blocks(llm: LLM) -> list[MoEFeedForward]:
    return [layer.ffn for layer in llm.loaded.model.layers]


def edited_copy(tmp_path: Path, config_changes: dict, drop_tensor: str | None = None) -> Path:
    """The fixture with ``config_changes`` merged into its config and, optionally, one tensor removed."""
    folder = TINY.edited_copy(tmp_path, FIXTURE.name, config_changes)
    if drop_tensor is not None:
        tensors = load_file(folder / "model.safetensors")
        del tensors[drop_tensor]
        save_file(tensors, folder / "model.safetensors")
    return folder


def test_registers_minimax_m2_with_serving_defaults() -> None:
    registration = load_plugins().get("model", "minimax_m2")
    assert registration.plugin.distribution == "atlas-model-minimax"
    assert registration.metadata["defaults"] == {"reasoning_parser": "qwen3", "tool_call_parser": "minimax_m2"}


def test_atlas_plugins_lists_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_plugins(capsys).splitlines()
    assert "minimax  atlas-model-minimax 0.1.0" in lines
    assert any(line.startswith("  model minimax_m2 -> atlas_model_minimax.loader:MiniMaxM2Loader (") for line in lines)


def test_layers_have_full_width_qk_norms_partial_rotary_and_sigmoid_routing() -> None:
    llm = LLM(FIXTURE)
    for layer in llm.loaded.model.layers:
        weights = layer.mixer.weights
        assert isinstance(weights.q_norm, AllHeadsRMSNorm) and isinstance(weights.k_norm, AllHeadsRMSNorm)
        assert weights.q_norm.norm.weight.shape == (4 * 16,) and weights.k_norm.norm.weight.shape == (2 * 16,)
        assert layer.mixer.rope_cos.shape[1] == 4  # rotary_dim 8 of head_dim 16
        moe = layer.ffn
        assert isinstance(moe, MoEFeedForward) and moe.correction_bias is not None
        assert (moe.spec.scoring, moe.spec.normalize_top_k, moe.spec.top_k, moe.spec.num_experts) == (
            "sigmoid",
            True,
            2,
            8,
        )


def test_all_heads_norm_normalises_each_token_over_every_head() -> None:
    llm = LLM(FIXTURE)
    norm = llm.loaded.model.layers[0].mixer.weights.q_norm
    x = np.random.default_rng(0).standard_normal((3, 4, 16)).astype(np.float32)
    flat = x.reshape(3, 64)
    want = flat / np.sqrt(np.mean(flat**2, axis=-1, keepdims=True) + 1e-6) * norm.norm.weight
    np.testing.assert_allclose(norm(x)[0], want.reshape(3, 4, 16), rtol=1e-5, atol=1e-6)


def test_legacy_rotary_dim_alone_gives_the_same_model(tmp_path: Path) -> None:
    """Released configs carry ``rotary_dim`` without ``partial_rotary_factor``."""
    config = json.loads((FIXTURE / "config.json").read_text())
    rope = {k: v for k, v in config["rope_parameters"].items() if k != "partial_rotary_factor"}
    llm = LLM(edited_copy(tmp_path, {"rope_parameters": rope, "rotary_dim": 8}))
    assert llm.loaded.model.layers[0].mixer.rope_cos.shape[1] == 4
    assert max_prompt_logprob_error(llm, TINY.reference("minimax_m2")) <= TOLERANCE


def test_correction_bias_changes_which_experts_some_tokens_use() -> None:
    llm = LLM(FIXTURE)
    backend = llm.engine.backend
    changed: list[np.ndarray] = []
    for moe in moe_blocks(llm):
        route = moe.route

        def recording(x, moe=moe, route=route):
            weights, ids = route(x)
            unbiased = backend.ops(MoEOps).moe_route(backend.linear(x, moe.router_weight), moe.spec, None)[1]
            with_bias, without = (np.sort(backend.to_numpy(i), axis=1) for i in (ids, unbiased))
            changed.append(np.any(with_bias != without, axis=1))
            return weights, ids

        moe.route = recording
    assert max_prompt_logprob_error(llm, TINY.reference("minimax_m2")) <= TOLERANCE
    assert np.concatenate(changed).sum() > 0, "the perturbed correction bias must change some token's experts"


def test_reference_catches_a_dropped_bias_or_renormalisation() -> None:
    llm = LLM(FIXTURE)
    assert max_prompt_logprob_error(llm, TINY.reference("minimax_m2")) <= TOLERANCE
    biases = [moe.correction_bias for moe in moe_blocks(llm)]
    for moe in moe_blocks(llm):
        moe.correction_bias = None
    assert max_prompt_logprob_error(llm, TINY.reference("minimax_m2")) > 10 * TOLERANCE
    for moe, bias in zip(moe_blocks(llm), biases, strict=True):
        moe.correction_bias = bias
        moe.spec = dataclasses.replace(moe.spec, normalize_top_k=False)
    assert max_prompt_logprob_error(llm, TINY.reference("minimax_m2")) > 10 * TOLERANCE


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    return greedy_alone(FIXTURE)


@pytest.mark.parametrize("settings", list(INVARIANCE_SETTINGS.values()), ids=list(INVARIANCE_SETTINGS))
def test_greedy_tokens_are_batch_invariant(alone: list[list[int]], settings: dict) -> None:
    assert_batch_invariant(FIXTURE, alone, settings)


def test_missing_correction_bias_is_an_error_unless_the_config_disables_it(tmp_path: Path) -> None:
    missing = "model.layers.0.block_sparse_moe.e_score_correction_bias"
    with pytest.raises(ModelLoadError, match="use_routing_bias"):
        LLM(edited_copy(tmp_path / "a", {}, drop_tensor=missing))
    llm = LLM(edited_copy(tmp_path / "b", {"use_routing_bias": False}, drop_tensor=missing))
    assert llm.loaded.model.layers[0].ffn.correction_bias is None


@pytest.mark.parametrize(
    "change", [{"scoring_func": "softmax"}, {"qk_norm_type": "per_head"}, {"shared_intermediate_size": 64}]
)
def test_unsupported_config_settings_are_refused(tmp_path: Path, change: dict) -> None:
    with pytest.raises(ModelLoadError, match=next(iter(change))):
        LLM(edited_copy(tmp_path, change))


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
