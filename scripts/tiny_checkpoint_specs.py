"""The tiny checkpoints `make_tiny_checkpoints.py` generates: one `Spec` per fixture folder.

Each package keeps the specs of its own checkpoints in ``tests/fixtures/tiny_specs.py`` (exporting
``SPECS: list[Spec]``) and the generated folders beside it, in ``tests/fixtures/tiny/<name>``;
`all_specs` collects every such module of the repository. Adding a family or variant means adding a
`Spec` there; the generator does the rest.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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
    extra_reference: Callable[[Any, Path], None] | None = None
    """``extra_reference(model, folder)`` writes further reference files into the fixture folder from the
    reloaded float32 model (e.g. logits over image + text prompts); None: none."""


REPO_ROOT = Path(__file__).resolve().parent.parent
SPEC_MODULES = ("plugins/**/tests/fixtures/tiny_specs.py", "tests/example_plugin/tests/fixtures/tiny_specs.py")
"""Where spec modules are found (globs relative to the repository root)."""


@dataclass(frozen=True)
class Target:
    """A fixture to generate: its spec and the folder its ``<name>`` folder is written into."""

    spec: Spec
    root: Path


def spec_modules() -> list[Path]:
    """Every spec module of the repository, sorted by path."""
    return sorted(path for pattern in SPEC_MODULES for path in REPO_ROOT.glob(pattern))


def load_specs(path: Path) -> list[Spec]:
    """The ``SPECS`` of the spec module at ``path`` (imported under a name made from its folder)."""
    folder = path.parent.relative_to(REPO_ROOT)
    name = "tiny_specs_" + "_".join(folder.parts).replace("-", "_")
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None, path
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return list(module.SPECS)


def all_specs() -> list[Target]:
    """Every `Spec` of every spec module, each with its package's ``tests/fixtures/tiny`` folder."""
    targets = [Target(spec, path.parent / "tiny") for path in spec_modules() for spec in load_specs(path)]
    names = [target.spec.name for target in targets]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        raise RuntimeError(f"fixture names defined twice: {sorted(duplicates)}")
    return targets
