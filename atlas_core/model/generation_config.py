"""Sampling defaults a checkpoint ships in ``generation_config.json`` (as vLLM's
``--generation-config auto`` reads them)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("atlas.model")

SAMPLING_KEYS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
}
"""The ``generation_config.json`` keys used as sampling defaults, with their types."""


def sampling_defaults(checkpoint: Path) -> dict[str, float | int]:
    """The sampling defaults of the checkpoint at ``checkpoint`` (a folder; a ``.gguf`` file has none):
    the `SAMPLING_KEYS` present in its ``generation_config.json`` with a number for value. A missing
    file gives ``{}``; an unreadable one is logged and gives ``{}``."""
    path = checkpoint / "generation_config.json"
    if not checkpoint.is_dir() or not path.is_file():
        return {}
    try:
        config: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s is not readable JSON (%s); no sampling defaults taken from it", path, exc)
        return {}
    if not isinstance(config, dict):
        return {}
    defaults: dict[str, float | int] = {}
    for key, kind in SAMPLING_KEYS.items():
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            defaults[key] = kind(value)
    return defaults
