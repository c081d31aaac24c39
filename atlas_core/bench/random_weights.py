"""Models of a given shape with random bf16 weights, for benchmarks where no checkpoint can be had.

``atlas bench latency --random-weights llama-3-8b`` builds the model from a built-in preset
(`PRESETS`, kept in ``presets.json``) or any ``config.json`` path through the family plugin
registered for its ``model_type``, exactly as a real checkpoint would be loaded, but every tensor is
a slice of one pool of random normal bf16 values (standard deviation 0.02; norm weights and scales
near 1), so nothing is downloaded and loading costs a copy. The family's loader names the tensors
(`ModelWeightLoader.checkpoint_shapes`); ``--num-layers N`` keeps the first N layers of a shape too
large for the device (`cut_layers`). A shape whose weights cannot fit the backend's memory is refused
before anything is built (`check_fits`).
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from atlas_core.backends.memory import available_memory, weight_itemsize
from atlas_core.errors import ConfigError, ModelLoadError

PRESETS: dict[str, dict[str, Any]] = json.loads(resources.files(__package__).joinpath("presets.json").read_text())
"""Shapes of real models: their published config.json values that matter here (``presets.json``)."""

POOL_ELEMENTS = 1 << 26
WEIGHT_STD = 0.02
BF16 = np.dtype(ml_dtypes.bfloat16)
NEAR_ONE_SUFFIXES = ("norm.weight", "scale", "layer_scalar")
"""1-D tensors drawn near 1 (norm weights, router and layer scales); other 1-D tensors near 0."""
PER_LAYER_KEYS = ("layer_types", "layers_block_type", "attn_type_list", "hybrid_override_pattern")
"""Config keys holding one entry per layer (lists, or Nemotron-H's pattern string)."""


def load_config(reference: str) -> tuple[str, dict[str, Any]]:
    """``(name, config)`` of a preset name or a ``config.json`` path (file or folder); the config is a copy."""
    if reference in PRESETS:
        return reference, copy.deepcopy(PRESETS[reference])
    path = Path(reference)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelLoadError(
            f"--random-weights: {reference!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json path"
        )
    return path.parent.name or str(path), json.loads(path.read_text())


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: ``text_config`` of a vision-language config, else ``config`` itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def layer_count(config: dict[str, Any]) -> int:
    """Decoder layers of ``config``: ``num_hidden_layers``, else the length of its per-layer pattern."""
    text = text_config(config)
    if text.get("num_hidden_layers") is not None:
        return int(text["num_hidden_layers"])
    for key in PER_LAYER_KEYS:
        if isinstance(text.get(key), (list, str)):
            return len(text[key])
    raise ModelLoadError("--random-weights: the config has no num_hidden_layers")


def cut_layers(config: dict[str, Any], keep: int) -> dict[str, Any]:
    """``config`` (a new dict) for the model's first ``keep`` layers: ``num_hidden_layers`` (in the
    ``text_config`` where there is one), the per-layer entries of `PER_LAYER_KEYS` and of Gemma 4's
    ``per_layer_config``, the ``mlp_only_layers`` indices, and the count of trailing KV-shared layers
    (``num_kv_shared_layers``) that remain among the kept ones."""
    config = copy.deepcopy(config)
    text, total = text_config(config), layer_count(config)
    if not 1 <= keep <= total:
        raise ModelLoadError(f"--num-layers {keep}: the model has {total} layers")
    text["num_hidden_layers"] = keep
    for key in PER_LAYER_KEYS:
        if isinstance(text.get(key), (list, str)) and len(text[key]) == total:
            text[key] = text[key][:keep]
    if isinstance(text.get("per_layer_config"), dict):
        text["per_layer_config"] = {k: v for k, v in text["per_layer_config"].items() if int(k) < keep}
    if isinstance(text.get("mlp_only_layers"), list):
        text["mlp_only_layers"] = [i for i in text["mlp_only_layers"] if i < keep]
    if text.get("num_kv_shared_layers"):
        text["num_kv_shared_layers"] = max(0, keep - (total - int(text["num_kv_shared_layers"])))
    return config


@functools.lru_cache(maxsize=1)
def random_pool(seed: int) -> np.ndarray:
    """`POOL_ELEMENTS` random normal bf16 values (standard deviation `WEIGHT_STD`), made once per seed:
    every tensor of a `RandomWeightSource` is a slice of it (read-only)."""
    pool = (np.random.default_rng(seed).standard_normal(POOL_ELEMENTS, dtype=np.float32) * WEIGHT_STD).astype(BF16)
    pool.flags.writeable = False
    return pool


class RandomWeightSource:
    """A `WeightSource` of random bf16 tensors with the given names and shapes."""

    def __init__(self, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], seed: int = 0) -> None:
        self.config = config
        self._rng = np.random.default_rng(seed + 1)
        self._pool = random_pool(seed)
        self._shapes = shapes

    def names(self) -> Iterator[str]:
        return iter(self._shapes)

    def __contains__(self, name: str) -> bool:
        return name in self._shapes

    def get(self, name: str) -> np.ndarray:
        if name not in self._shapes:
            raise ModelLoadError(f"random weights: no tensor {name!r} in a {self.config.get('model_type')} model")
        shape = self._shapes[name]
        if len(shape) == 1:  # norm weights and scales near 1, biases near 0
            noise = self._rng.standard_normal(shape[0], dtype=np.float32) * 0.02
            return (noise + (1.0 if name.endswith(NEAR_ONE_SUFFIXES) else 0.0)).astype(BF16)
        count = math.prod(shape)
        if count > POOL_ELEMENTS:
            return np.resize(self._pool, count).reshape(shape)
        start = int(self._rng.integers(0, POOL_ELEMENTS - count + 1))
        return self._pool[start : start + count].reshape(shape)


def check_fits(name: str, shapes: dict[str, tuple[int, ...]], backend: Any, layers: int, reserve: int = 0) -> None:
    """A `ModelLoadError` saying so when the weights of ``shapes``, stored in the backend's weight
    dtype (plus, on the host, one tensor's bf16 copy while it is converted), and ``reserve`` bytes
    (a host KV cache) exceed the free memory (`available_memory`)."""
    available = available_memory(backend)
    if available is None:
        return
    itemsize = weight_itemsize(backend)
    sizes = [math.prod(shape) for shape in shapes.values()]
    needed = sum(sizes) * itemsize + (2 * max(sizes) if backend.device_memory() is None else 0)
    if needed + reserve <= available[0]:
        return
    head = sum(math.prod(s) for n, s in shapes.items() if n.endswith(("embed_tokens.weight", "embeddings.weight")))
    head += sum(math.prod(s) for n, s in shapes.items() if n.endswith("lm_head.weight"))
    tables = f"the embedding and LM head alone take {head * itemsize / 1e9:.1f} GB"
    advice = "lower --num-layers" if layers > 1 else f"one layer is the fewest ({tables}): run it where more is free"
    kv = f" and its KV cache {reserve / 1e9:.1f} GB" if reserve else ""
    raise ModelLoadError(
        f"--random-weights {name}: its weights take {needed / 1e9:.1f} GB as {backend.name} weights "
        f"({itemsize} bytes each){kv}, but only {available[0] / 1e9:.1f} GB of {available[1]} is left; {advice}"
    )


def random_weights_llm(
    reference: str, *, backend: str | None = None, num_layers: int | None = None, **engine_args: Any
) -> Any:
    """An `LLM` over a model of ``reference``'s shape with random weights (no tokenizer: prompts are ids),
    cut to its first ``num_layers`` layers when given (`cut_layers`); `check_fits` first."""
    from atlas_core.backends.select import select_backend
    from atlas_core.engine.config import EngineConfig, kv_budget
    from atlas_core.engine.llm import LLM
    from atlas_core.engine.llm_engine import LLMEngine
    from atlas_core.model.load import LoadedModel
    from atlas_core.model.resolve import ResolvedModel
    from atlas_core.plugins import get_registry

    name, config = load_config(reference)
    if num_layers is not None:
        config = cut_layers(config, num_layers)
        name = f"{name}, {num_layers} layer{'s' if num_layers > 1 else ''}"
    engine_config = EngineConfig(**engine_args)
    if engine_config.replica_settings().world > 1:
        raise ConfigError(
            "--random-weights builds the model on one rank; tensor_parallel_size or expert_parallel_size above 1 "
            "needs a checkpoint (each rank reads its share of it)"
        )
    registry = get_registry()
    chosen = select_backend(registry, backend)
    registration = registry.find("model", config.get("model_type", ""))
    if registration is None:
        raise ModelLoadError(
            f"--random-weights {reference}: no installed family plugin for model_type {config.get('model_type')!r}"
        )
    loader_class = registration.load()
    shapes = loader_class.checkpoint_shapes(config)
    speculation = engine_config.speculation
    if speculation is not None and speculation.method == "mtp" and hasattr(loader_class, "mtp_checkpoint_shapes"):
        shapes |= loader_class.mtp_checkpoint_shapes(config)  # the MTP layers the speculation reads
    host_kv = kv_budget(chosen, engine_config)[0] if chosen.device_memory() is None else 0
    check_fits(name, shapes, chosen, layer_count(config), host_kv)
    source = RandomWeightSource(config, shapes)
    max_positions = engine_config.max_seq_len or engine_config.default_max_seq_len
    model = loader_class(source, chosen, registry, f"random weights ({name})", max_positions).build()
    loaded = LoadedModel(
        name=f"{name} (random weights)",
        resolved=ResolvedModel(Path(reference), "random", name),
        config=config,
        model=model,
        tokenizer=None,
        family_defaults=dict(registration.metadata.get("defaults", {})),
        source=source,
    )
    llm = LLM.__new__(LLM)
    llm.backend, llm.loaded = chosen, loaded
    llm.engine = LLMEngine(loaded, chosen, engine_config)
    llm._ids = itertools.count()
    return llm
