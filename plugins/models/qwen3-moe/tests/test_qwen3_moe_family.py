"""atlas-model-qwen3-moe: registration, which layers are sparse, routing, sensitivity of the parity
reference to the routing details, batch invariance and bad configs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.mlp import SwiGLUMLP
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.cli import run_plugins
from atlas_core.testing.family import INVARIANCE_SETTINGS, assert_batch_invariant, greedy_alone
from atlas_core.testing.parity import TOLERANCE, ReferenceParity, max_prompt_logprob_error

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


def moe_blocks(llm: LLM) -> dict[int, MoEFeedForward]:
    return {i: layer.ffn for i, layer in enumerate(llm.loaded.model.layers) if isinstance(layer.ffn, MoEFeedForward)}


def test_registers_qwen3_moe_with_serving_defaults() -> None:
    registration = load_plugins().get("model", "qwen3_moe")
    assert registration.plugin.distribution == "atlas-model-qwen3-moe"
    assert registration.metadata["defaults"] == {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}


def test_atlas_plugins_lists_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_plugins(capsys).splitlines()
    assert "qwen3_moe  atlas-model-qwen3-moe 0.1.0" in lines
    assert any(line.startswith("  model qwen3_moe -> atlas_model_qwen3_moe.loader:Qwen3MoeLoader (") for line in lines)


@pytest.mark.parametrize(("fixture", "sparse"), [("qwen3_moe", {0, 2}), ("qwen3_moe_sparse_step", {1, 3})])
def test_sparse_layers_follow_mlp_only_layers_and_decoder_sparse_step(fixture: str, sparse: set[int]) -> None:
    llm = LLM(TINY / fixture)
    layers = llm.loaded.model.layers
    assert set(moe_blocks(llm)) == sparse
    assert all(isinstance(layers[i].ffn, SwiGLUMLP) for i in set(range(len(layers))) - sparse)
    assert all(layer.mixer.weights.q_norm is not None for layer in layers)
    spec = moe_blocks(llm)[min(sparse)].spec
    assert (spec.num_experts, spec.top_k, spec.scoring) == (8, 2, "softmax")
    assert spec.normalize_top_k == (fixture == "qwen3_moe")


def test_router_sends_different_tokens_to_different_experts() -> None:
    llm = LLM(TINY / "qwen3_moe")
    chosen: list[np.ndarray] = []
    for moe in moe_blocks(llm).values():
        route = moe.route

        def recording(x, route=route):
            weights, ids = route(x)
            chosen.append(llm.engine.backend.to_numpy(ids))
            return weights, ids

        moe.route = recording
    llm.generate(list(range(0, 240, 7)), SamplingParams(temperature=0, max_tokens=4))
    ids = np.concatenate(chosen)
    assert set(ids.ravel().tolist()) == set(range(8)), "every expert serves some token"
    assert len({tuple(sorted(row)) for row in ids.tolist()}) >= 8, "tokens pick many different expert pairs"


@pytest.mark.parametrize("fixture", ["qwen3_moe", "qwen3_moe_sparse_step"])
def test_reference_catches_wrong_renormalisation(fixture: str) -> None:
    """Flipping ``norm_topk_prob`` moves the log-probs far beyond the parity tolerance."""
    llm = LLM(TINY / fixture)
    assert max_prompt_logprob_error(llm, TINY.reference(fixture)) <= TOLERANCE
    for moe in moe_blocks(llm).values():
        moe.spec = dataclasses.replace(moe.spec, normalize_top_k=not moe.spec.normalize_top_k)
    assert max_prompt_logprob_error(llm, TINY.reference(fixture)) > 10 * TOLERANCE


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    return greedy_alone(TINY / "qwen3_moe")


@pytest.mark.parametrize("settings", list(INVARIANCE_SETTINGS.values()), ids=list(INVARIANCE_SETTINGS))
def test_greedy_tokens_are_batch_invariant(alone: list[list[int]], settings: dict) -> None:
    assert_batch_invariant(TINY / "qwen3_moe", alone, settings)


def test_sliding_window_checkpoints_are_refused(tmp_path: Path) -> None:
    folder = TINY.edited_copy(tmp_path, "qwen3_moe", {"use_sliding_window": True, "sliding_window": 16})
    with pytest.raises(ModelLoadError, match="use_sliding_window"):
        LLM(folder)


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
