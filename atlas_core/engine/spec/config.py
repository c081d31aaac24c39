"""`SpeculativeConfig`: which proposer drafts tokens and how many, from vLLM's ``speculative_config``
names (``{"method": "ngram", "num_speculative_tokens": 4}``) or the ``num_speculative_tokens`` shorthand."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, cast, get_args

from atlas_core.errors import ConfigError

SpeculativeMethod = Literal["ngram", "mtp", "draft_model"]
METHOD_ALIASES = {
    "ngram": "ngram",
    "prompt_lookup": "ngram",
    "mtp": "mtp",
    "qwen3_next_mtp": "mtp",
    "qwen3_5_mtp": "mtp",
    "draft_model": "draft_model",
    "draft": "draft_model",
}
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine speculates (see `atlas_core.engine.spec`).

    ``method``: ``ngram`` (prompt lookup: the continuation of the latest earlier occurrence of the
    sequence's last n tokens, n from ``prompt_lookup_max`` down to ``prompt_lookup_min``), ``mtp`` (the
    checkpoint's own multi-token-prediction layers, chained ``num_speculative_tokens`` times) or
    ``draft_model`` (greedy proposals of the smaller checkpoint ``model``, which must share the
    target's tokenizer). ``num_speculative_tokens``: K, the most draft tokens verified per sequence
    and step (1..16).
    """

    method: SpeculativeMethod
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}"
            )
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ConfigError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"prompt_lookup_min={self.prompt_lookup_min} and prompt_lookup_max={self.prompt_lookup_max}"
            )
        if self.method == "draft_model" and not self.model:
            raise ConfigError(
                'speculative method "draft_model" needs "model": the draft checkpoint (a folder, .gguf file or '
                "repo id) sharing the target's tokenizer"
            )
        if self.method != "draft_model" and self.model is not None:
            raise ConfigError(f'"model" is the draft checkpoint of method "draft_model", not of {self.method!r}')


def speculative_config(spec: dict[str, Any] | None, num_speculative_tokens: int | None) -> SpeculativeConfig | None:
    """The config of ``--speculative-config JSON`` and ``--num-speculative-tokens K``; None: no speculation.

    ``num_speculative_tokens`` alone means n-gram speculation with K tokens; with ``spec`` it fills in
    (or must agree with) the JSON's ``num_speculative_tokens``. A ``model`` without ``method`` means
    ``draft_model``. Unknown keys and values raise `ConfigError` naming what is accepted.
    """
    if not spec:
        if num_speculative_tokens is None:
            return None
        return SpeculativeConfig("ngram", num_speculative_tokens)
    entries = dict(spec)
    known = {field.name for field in fields(SpeculativeConfig)}
    unknown = sorted(set(entries) - known)
    if unknown:
        raise ConfigError(f"speculative_config: unknown keys {unknown}; accepted: {sorted(known)}")
    method = entries.pop("method", "draft_model" if entries.get("model") else None)
    if method not in METHOD_ALIASES:
        accepted = ", ".join(get_args(SpeculativeMethod))
        raise ConfigError(f"speculative_config: method must be one of {accepted}, got {method!r}")
    given = entries.pop("num_speculative_tokens", None)
    if given is not None and num_speculative_tokens is not None and given != num_speculative_tokens:
        raise ConfigError(
            f"num_speculative_tokens={num_speculative_tokens} disagrees with speculative_config's {given}; give one"
        )
    count = given if given is not None else num_speculative_tokens
    if count is None:
        raise ConfigError('speculative_config needs "num_speculative_tokens" (K draft tokens per step)')
    for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
        value = count if name == "num_speculative_tokens" else entries.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"speculative_config: {name} must be an integer, got {value!r}")
    model = entries.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"speculative_config: model must be a path or repo id, got {model!r}")
    return SpeculativeConfig(cast(SpeculativeMethod, METHOD_ALIASES[method]), count, model=model, **entries)
