"""atlas-model-qwen3: registration, per-head q/k norms, serving defaults, parity with transformers."""

from __future__ import annotations

from pathlib import Path

from atlas_core import LLM
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import ReferenceParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


def test_registers_qwen3_with_serving_defaults() -> None:
    registration = load_plugins().get("model", "qwen3")
    assert registration.plugin.distribution == "atlas-model-qwen3"
    assert registration.metadata["defaults"]["reasoning_parser"] == "qwen3"


def test_qwen3_layers_have_qk_norm() -> None:
    llm = LLM(TINY / "qwen3")
    weights = llm.loaded.model.layers[0].mixer.weights
    assert weights.q_norm is not None and weights.k_norm is not None
    assert llm.loaded.family_defaults["tool_call_parser"] == "hermes"


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
