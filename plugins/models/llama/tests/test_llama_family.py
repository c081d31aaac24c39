"""atlas-model-llama: registration, the config quirks of its families, parity with transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from atlas_core import LLM
from atlas_core.errors import ModelLoadError
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import ReferenceParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


def test_registers_llama_mistral_and_qwen2() -> None:
    registry = load_plugins()
    for model_type in ("llama", "mistral", "qwen2"):
        registration = registry.get("model", model_type)
        assert registration.plugin.distribution == "atlas-model-llama"


def test_qwen2_has_qkv_bias_but_no_output_bias() -> None:
    llm = LLM(TINY / "qwen2")
    attention = llm.loaded.model.layers[0].mixer.weights
    assert attention.qkv_bias is not None and attention.o_bias is None


def test_mistral_sliding_window_is_refused_clearly(tmp_path: Path) -> None:
    folder = TINY.edited_copy(tmp_path, "mistral", {"sliding_window": 16})
    with pytest.raises(ModelLoadError, match="sliding_window=16 is shorter than max_position_embeddings"):
        LLM(folder)


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
