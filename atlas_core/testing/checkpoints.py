"""Tiny reference checkpoints: small random models in Hugging Face format with a reference's outputs.

A checkpoint is a folder holding ``config.json``, safetensors weights and ``reference.npz``: for
each of `REFERENCE_PROMPTS` prompts ``i``, ``prompt_i`` (token ids), ``logprobs_i`` (the reference
implementation's log-softmax at every prompt position), ``greedy_i`` (its greedy continuation) and
``greedy_logprobs_i`` (the log-softmax that chose each greedy token); ``docs/tiny-checkpoints.md``
gives every key. A package keeps its checkpoints in ``tests/fixtures/tiny/<name>``, next to the
``tests/fixtures/tiny_specs.py`` that ``scripts/make_tiny_checkpoints.py`` makes them from.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas_core import LLM
from atlas_core.model.load import KNOWN_FAMILY_PACKAGES
from atlas_core.plugins import get_registry

REFERENCE_PROMPTS = 4
"""How many prompts every ``reference.npz`` holds (``prompt_0`` .. ``prompt_3``)."""

SHARED_KV_CACHE_GIB = 1 / 16
"""KV cache of each `TinyCheckpoints.shared_llm` on a host backend: ample for tiny checkpoints."""


class TinyCheckpoints:
    """The checkpoints directly under one or more folders, by folder name.

    A sub-folder is a checkpoint when it holds a ``config.json``; two with the same name are an
    error. ``checkpoints / name`` is a checkpoint's folder (KeyError naming the known ones when
    there is none), as in ``LLM(TINY / "llama")``.
    """

    def __init__(self, *roots: Path) -> None:
        self.folders: dict[str, Path] = {}
        for root in roots:
            for folder in sorted(Path(root).iterdir()):
                if not (folder / "config.json").is_file():
                    continue
                if folder.name in self.folders:
                    duplicate = self.folders[folder.name]
                    raise ValueError(f"two tiny checkpoints named {folder.name!r}: {duplicate}, {folder}")
                self.folders[folder.name] = folder
        self._llms: dict[tuple[str, str], LLM] = {}

    @property
    def names(self) -> list[str]:
        """Every checkpoint's name, sorted."""
        return sorted(self.folders)

    def __truediv__(self, name: str) -> Path:
        if name not in self.folders:
            raise KeyError(f"no tiny checkpoint {name!r}; have {self.names}")
        return self.folders[name]

    def config(self, name: str) -> dict[str, Any]:
        """The checkpoint's ``config.json``."""
        return json.loads((self / name / "config.json").read_text())

    def reference(self, name: str) -> dict[str, np.ndarray]:
        """The checkpoint's ``reference.npz``, every array read into memory."""
        with np.load(self / name / "reference.npz") as data:
            return dict(data)

    def shared_llm(self, name: str, backend: str = "numpy") -> LLM:
        """One `LLM` per checkpoint and backend, loaded on first use and kept as long as this object
        (so a broken family fails the tests that use it, once each). Callers must leave it idle: every
        request they add is finished or aborted before they return. On host backends its KV cache takes
        `SHARED_KV_CACHE_GIB`: a session keeps one per checkpoint, and host KV memory is resident."""
        key = (name, backend)
        if key not in self._llms:
            self._llms[key] = LLM(self / name, backend=backend, kv_cache_memory_gib=SHARED_KV_CACHE_GIB)
        return self._llms[key]

    def edited_copy(
        self,
        destination: Path,
        name: str,
        changes: dict[str, Any] | None = None,
        *,
        edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path:
        """A copy of checkpoint ``name`` in ``destination / name`` whose config.json has ``changes``
        merged in (top-level keys) and then ``edit(config)`` applied in place (nested changes,
        deletions): for tests of configs and checkpoints a loader must refuse or accept."""
        folder = destination / name
        shutil.copytree(self / name, folder)
        config = json.loads((folder / "config.json").read_text()) | (changes or {})
        if edit is not None:
            edit(config)
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    def with_word_tokenizer(self, destination: Path, name: str, words: list[str]) -> Path:
        """A copy of checkpoint ``name`` in ``destination / name`` with a word-level tokenizer.json over ``words``
        (ids 1, 2, ... in order; 0 is ``[UNK]``; whitespace and punctuation split words): tiny checkpoints have no
        tokenizer of their own."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        folder = self.edited_copy(destination, name)
        vocab = {"[UNK]": 0} | {word: i + 1 for i, word in enumerate(words)}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.save(str(folder / "tokenizer.json"))
        return folder


def require_family(folder: Path) -> None:
    """Skip the calling test (or module) when checkpoint ``folder``'s model family is not installed.

    Skips only when no installed plugin registers the config's ``model_type`` and the distribution
    known to provide it (``atlas_core.model.load.KNOWN_FAMILY_PACKAGES``) is not installed either (for
    a model type of no known distribution: when no installed plugin failed to load). A family that is
    installed but fails to load is never skipped: the test fails."""
    model_type = json.loads((folder / "config.json").read_text()).get("model_type", "")
    registry = get_registry()
    if registry.find("model", model_type) is not None:
        return
    distribution = KNOWN_FAMILY_PACKAGES.get(model_type)
    if distribution is None:
        broken = [f"{plugin.label}: {'; '.join(plugin.errors)}" for plugin in registry.plugins if plugin.errors]
        if broken:
            pytest.fail(f"{folder.name}: no plugin reads model_type {model_type!r}; plugins failed to load: {broken}")
        pytest.skip(f"{folder.name}: no installed plugin reads model_type {model_type!r}", allow_module_level=True)
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        pytest.skip(
            f"{folder.name}: model_type {model_type!r} needs {distribution}, which is not installed",
            allow_module_level=True,
        )
