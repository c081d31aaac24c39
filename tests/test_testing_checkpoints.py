"""`atlas_core.testing.checkpoints`: finding and reading tiny checkpoints, edited copies, and skipping a
test only when the family a checkpoint needs is not installed (never when it is installed but broken)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.testing import checkpoints
from atlas_core.testing.checkpoints import REFERENCE_PROMPTS, TinyCheckpoints, require_family
from tests.conftest import TINY

QWEN3 = TINY.folders["qwen3"]


@pytest.fixture
def two_roots(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "not_a_checkpoint").mkdir(parents=True)
    second.mkdir()
    return first, second


def test_checkpoints_are_found_by_folder_name_across_roots(two_roots: tuple[Path, Path]) -> None:
    first, second = two_roots
    TinyCheckpoints(QWEN3.parent).edited_copy(first, "qwen3")
    TinyCheckpoints(QWEN3.parent).edited_copy(second, "qwen3").rename(second / "other")
    found = TinyCheckpoints(first, second)
    assert found.names == ["other", "qwen3"]
    assert found / "qwen3" == first / "qwen3"
    assert found.config("other")["model_type"] == "qwen3"
    reference = found.reference("qwen3")
    assert {f"prompt_{i}" for i in range(REFERENCE_PROMPTS)} <= set(reference)
    assert isinstance(reference["logprobs_0"], np.ndarray)
    with pytest.raises(KeyError, match=r"no tiny checkpoint 'missing'; have \['other', 'qwen3'\]"):
        _ = found / "missing"


def test_two_checkpoints_with_one_name_are_an_error(two_roots: tuple[Path, Path]) -> None:
    for root in two_roots:
        TinyCheckpoints(QWEN3.parent).edited_copy(root, "qwen3")
    with pytest.raises(ValueError, match="two tiny checkpoints named 'qwen3'"):
        TinyCheckpoints(*two_roots)


def test_edited_copy_merges_changes_then_applies_the_edit(tmp_path: Path) -> None:
    folder = TinyCheckpoints(QWEN3.parent).edited_copy(
        tmp_path, "qwen3", {"sliding_window": 16}, edit=lambda config: config.pop("head_dim")
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["sliding_window"] == 16 and "head_dim" not in config
    assert json.loads((QWEN3 / "config.json").read_text())["head_dim"] == 16, "the original is untouched"


def with_model_type(tmp_path: Path, model_type: str) -> Path:
    return TinyCheckpoints(QWEN3.parent).edited_copy(tmp_path, "qwen3", {"model_type": model_type})


def test_a_family_whose_distribution_is_not_installed_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(checkpoints.KNOWN_FAMILY_PACKAGES, "imaginary", "atlas-model-imaginary")
    with pytest.raises(pytest.skip.Exception, match="needs atlas-model-imaginary, which is not installed"):
        require_family(with_model_type(tmp_path, "imaginary"))
    with pytest.raises(pytest.skip.Exception, match="no installed plugin reads model_type 'unheard_of'"):
        require_family(with_model_type(tmp_path / "2", "unheard_of"))


def test_an_installed_family_is_never_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_family(QWEN3)  # registered: nothing to skip
    monkeypatch.setitem(checkpoints.KNOWN_FAMILY_PACKAGES, "unregistered", "atlas-core")
    require_family(with_model_type(tmp_path, "unregistered"))  # installed but not registering it: the test fails later
    broken = SimpleNamespace(label="atlas-broken 1.0", errors=["import failed: RuntimeError: boom"])
    registry = SimpleNamespace(find=lambda kind, name: None, plugins=[broken])
    monkeypatch.setattr(checkpoints, "get_registry", lambda: registry)
    with pytest.raises(pytest.fail.Exception, match="plugins failed to load: .*atlas-broken 1.0: import failed"):
        require_family(with_model_type(tmp_path / "2", "unheard_of"))
