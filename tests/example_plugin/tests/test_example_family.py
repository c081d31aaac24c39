"""The example family on its own tiny checkpoint, with nothing but Atlas's public testing helpers:
parity with transformers on core's NumPy backend and on this plugin's counting backend, the engine
invariants every family keeps, and the plugin's own layer really composed into the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from atlas_example_plugin.backend import CountingNumpyBackend
from atlas_example_plugin.layers import CountingRMSNorm

from atlas_core import LLM
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import INVARIANCE_SETTINGS, assert_batch_invariant, greedy_alone
from atlas_core.testing.parity import ReferenceParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


class TestReferenceParity(ReferenceParity):
    """``example_llama`` against its transformers reference, on core's NumPy backend."""

    checkpoints = TINY


class TestReferenceParityOnCountingBackend(ReferenceParity):
    """The same on this plugin's ``example-numpy`` backend."""

    checkpoints = TINY
    backend = "example-numpy"


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    return greedy_alone(TINY / "example_llama")


@pytest.mark.parametrize("settings", INVARIANCE_SETTINGS.values(), ids=INVARIANCE_SETTINGS.keys())
def test_greedy_tokens_are_batch_invariant(alone: list[list[int]], settings: dict[str, Any]) -> None:
    assert_batch_invariant(TINY / "example_llama", alone, settings)


def test_the_family_runs_the_plugins_norm_layer_and_backend_ops() -> None:
    norm_calls = CountingRMSNorm.calls
    llm = LLM(TINY / "example_llama", backend="example-numpy")
    llm.generate([1, 2, 3])
    assert CountingRMSNorm.calls > norm_calls
    assert isinstance(llm.backend, CountingNumpyBackend)
    assert llm.backend.op_calls["attention"] > 0 and llm.backend.op_calls["rms_norm"] > 0
