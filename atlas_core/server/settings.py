"""`atlas serve` settings: each comes from the command line, else the environment (``ATLAS_`` +
the flag's name in capitals, ``-`` as ``_``: ``--max-num-seqs`` is ``ATLAS_MAX_NUM_SEQS``), else
the model family's defaults (registration metadata ``defaults``), else the built-in default.

Environment values are parsed like the flag's value; lists are comma-separated; booleans accept
1/0, true/false, yes/no, on/off.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from atlas_core.errors import AtlasError

ENV_PREFIX = "ATLAS_"


def env_name(option: str) -> str:
    """``max_num_seqs`` -> ``ATLAS_MAX_NUM_SEQS``."""
    return ENV_PREFIX + option.upper()


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected one of 1/0, true/false, yes/no, on/off, got {text!r}")


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def json_object(text: str) -> dict[str, Any]:
    """Parse a JSON object (for ``--default-chat-template-kwargs``)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


ENV_PARSERS: dict[str, Callable[[str], Any]] = {
    "model": str, "backend": str, "max_seq_len": int, "max_num_seqs": int, "max_num_batched_tokens": int,
    "max_prefill_tokens": int, "enable_prefix_caching": _bool, "scheduling_policy": str,
    "gpu_memory_utilization": float, "kv_cache_memory_gib": float, "max_state_snapshots": int,
    "host": str, "port": int, "served_model_name": _list, "tool_call_parser": str, "reasoning_parser": str,
    "chat_template": str, "default_chat_template_kwargs": json_object, "api_key": _list, "api_keys_file": str,
    "request_timeout": float, "max_body_bytes": int, "cors_allow_origins": _list, "shutdown_timeout": float,
}
"""Every option `atlas serve` reads from the environment, and how its text is parsed."""

BEFORE_LOADING = ("model", "backend", "max_seq_len")
"""Options needed to find and load the model (``max_seq_len`` sizes its position tables), so family
defaults cannot set them."""


class Settings:
    """Resolved option values, each with where it came from (``flag``, ``env``, ``family``, ``default``)."""

    def __init__(self, flags: Mapping[str, Any], defaults: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        for option, parse in ENV_PARSERS.items():
            if flags.get(option) is not None:
                self.values[option], self.sources[option] = flags[option], "flag"
            elif env.get(env_name(option), "") != "":
                try:
                    self.values[option] = parse(env[env_name(option)])
                except ValueError as exc:
                    raise AtlasError(f"environment variable {env_name(option)}: {exc}") from None
                self.sources[option] = "env"
            else:
                self.values[option], self.sources[option] = defaults.get(option), "default"

    def apply_family_defaults(self, family_defaults: Mapping[str, Any]) -> list[str]:
        """Use the family's value for every option still at its built-in default; returns the
        family keys that name no option (for a warning)."""
        unknown = []
        for option, value in family_defaults.items():
            if option not in ENV_PARSERS or option in BEFORE_LOADING:
                unknown.append(option)
            elif self.sources[option] == "default":
                self.values[option], self.sources[option] = value, "family"
        return unknown

    def __getitem__(self, option: str) -> Any:
        return self.values[option]


def chat_template_text(reference: str) -> str:
    """``--chat-template``: a file path, or the Jinja template itself."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{%" in reference or "{{" in reference:
        return reference
    raise AtlasError(f"--chat-template {reference!r}: no such file, and it does not look like a Jinja template")


def parser_name(value: str | None) -> str | None:
    """``none`` (any case) or empty turns a family's default parser off."""
    return None if value is None or value.strip().lower() in ("", "none") else value
