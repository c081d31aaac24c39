"""Models of a given shape with random bf16 weights, for benchmarks where no checkpoint can be had.

``atlas bench latency --random-weights llama-3-8b`` builds the model from a built-in preset (or any
``config.json`` path) through the family plugin registered for its ``model_type``, exactly as a real
checkpoint would be loaded, but every tensor is a slice of one pool of random normal bf16 values
(standard deviation 0.02, norm weights near 1), so nothing is downloaded and loading costs a copy.
The family's loader names the tensors (`ModelWeightLoader.checkpoint_shapes`); ``--num-layers N``
keeps the first N layers of a shape too large for the device.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from atlas_core.errors import ModelLoadError

PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
}
"""Shapes of real models (their published config.json values that matter here)."""

POOL_ELEMENTS = 1 << 26
WEIGHT_STD = 0.02
BF16 = np.dtype(ml_dtypes.bfloat16)


def load_config(reference: str) -> tuple[str, dict[str, Any]]:
    """``(name, config)`` of a preset name or a ``config.json`` path (file or folder)."""
    if reference in PRESETS:
        return reference, dict(PRESETS[reference])
    path = Path(reference)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelLoadError(
            f"--random-weights: {reference!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json path"
        )
    return path.parent.name or str(path), json.loads(path.read_text())


class RandomWeightSource:
    """A `WeightSource` of random bf16 tensors with the given names and shapes."""

    def __init__(self, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], seed: int = 0) -> None:
        self.config = config
        rng = np.random.default_rng(seed)
        self._rng = rng
        self._pool = (rng.standard_normal(POOL_ELEMENTS, dtype=np.float32) * WEIGHT_STD).astype(BF16)
        self._shapes = shapes

    def names(self) -> Iterator[str]:
        return iter(self._shapes)

    def __contains__(self, name: str) -> bool:
        return name in self._shapes

    def get(self, name: str) -> np.ndarray:
        if name not in self._shapes:
            raise ModelLoadError(f"random weights: no tensor {name!r} in a {self.config.get('model_type')} model")
        shape = self._shapes[name]
        if len(shape) == 1:  # norm weights near 1, biases near 0
            noise = self._rng.standard_normal(shape[0], dtype=np.float32) * 0.02
            return (noise + (1.0 if name.endswith("norm.weight") else 0.0)).astype(BF16)
        count = math.prod(shape)
        if count > POOL_ELEMENTS:
            return np.resize(self._pool, count).reshape(shape)
        start = int(self._rng.integers(0, POOL_ELEMENTS - count + 1))
        return self._pool[start : start + count].reshape(shape)


def random_weights_llm(
    reference: str, *, backend: str | None = None, num_layers: int | None = None, **engine_args: Any
) -> Any:
    """An `LLM` over a model of ``reference``'s shape with random weights (no tokenizer: prompts are ids),
    cut to its first ``num_layers`` layers when given."""
    from atlas_core.backends.select import select_backend
    from atlas_core.engine.config import EngineConfig
    from atlas_core.engine.llm import LLM
    from atlas_core.engine.llm_engine import LLMEngine
    from atlas_core.model.load import LoadedModel
    from atlas_core.model.resolve import ResolvedModel
    from atlas_core.plugins import get_registry

    name, config = load_config(reference)
    if num_layers is not None:
        if not 1 <= num_layers <= int(config["num_hidden_layers"]):
            raise ModelLoadError(f"--num-layers {num_layers}: {name} has {config['num_hidden_layers']} layers")
        config["num_hidden_layers"] = num_layers
        name = f"{name}, {num_layers} layers"
    registry = get_registry()
    chosen = select_backend(registry, backend)
    registration = registry.find("model", config.get("model_type", ""))
    if registration is None:
        raise ModelLoadError(
            f"--random-weights {reference}: no installed family plugin for model_type {config.get('model_type')!r}"
        )
    loader_class = registration.load()
    source = RandomWeightSource(config, loader_class.checkpoint_shapes(config))
    model = loader_class(source, chosen, registry, f"random weights ({name})").build()
    loaded = LoadedModel(
        name=f"{name} (random weights)",
        resolved=ResolvedModel(Path(reference), "random", name),
        config=config,
        model=model,
        tokenizer=None,
        family_defaults=dict(registration.metadata.get("defaults", {})),
    )
    llm = LLM.__new__(LLM)
    llm.backend, llm.loaded = chosen, loaded
    llm.engine = LLMEngine(loaded, chosen, EngineConfig(**engine_args))
    llm._ids = itertools.count()
    return llm
