"""The tiny checkpoints `make_tiny_checkpoints.py` generates: one `Spec` per fixture folder.

Specs live in ``scripts/tiny_specs/<family>.py`` modules, each exporting ``SPECS: list[Spec]``;
`all_specs` collects them. Adding a family or variant means adding a `Spec` there; the generator
does the rest.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

WEIGHT_STD = 0.1  # default 0.02 leaves the top-2 logits nearly tied

COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "initializer_range": WEIGHT_STD,
}


@dataclass
class Spec:
    name: str
    config_cls: type
    config_kwargs: dict[str, Any]
    seed: int
    description: str
    save_dtype: torch.dtype = torch.float32
    max_shard_size: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    model_cls: type | None = None
    """The transformers model class; None: ``AutoModelForCausalLM`` (e.g. ``Mistral4ForCausalLM`` has no auto entry)."""
    init: Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None
    """``init(name, param, noise)`` -> the new value of a parameter the default rule does not cover
    (or to override it); None keeps the default (see `reinitialise`). ``noise`` is standard normal."""
    prompt_lengths: tuple[int, ...] = (1, 7, 19, 40)
    """Lengths of the random prompts (e.g. longer than a sliding window)."""


def all_specs() -> list[Spec]:
    """Every `Spec` of every ``scripts/tiny_specs`` module, in module-name order."""
    import tiny_specs

    specs: list[Spec] = []
    for module in sorted(m.name for m in pkgutil.iter_modules(tiny_specs.__path__)):
        specs.extend(importlib.import_module(f"tiny_specs.{module}").SPECS)
    names = [spec.name for spec in specs]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        raise RuntimeError(f"fixture names defined twice: {sorted(duplicates)}")
    return specs


