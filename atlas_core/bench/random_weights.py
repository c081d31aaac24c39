"""Models of a given shape with random bf16 weights, for benchmarks where no checkpoint can be had.

``atlas bench latency --random-weights llama-3-8b`` builds the model from a built-in preset
(`PRESETS`, kept in ``presets.json``) or any ``config.json`` path through the family plugin
registered for its ``model_type``, exactly as a real checkpoint would be loaded, but from random
weights (``load_format="dummy"``, `atlas_core.weights.random_source`), so nothing is downloaded and
loading costs a copy. ``--num-layers N`` keeps the first N layers of a shape too large for the device
(`cut_layers`). A shape whose weights cannot fit the backend's memory is refused before anything is
built (`check_fits`). Split models work as with a checkpoint: every rank builds its share of the same
random model from the config that `random_weights_llm` writes to a temporary folder. ``--quantization fp8``
or ``nvfp4`` declares that quantization in it (`QUANTIZATION_CONFIGS`), so the decoder layers' linear
weights are random FP8 or NVFP4 as such a checkpoint holds them; ``gguf_q4_k`` and the other GGUF block formats
(their format names, `QTYPES`) make them random blocks of that format, kept as stored (the embedding and LM head
stay bf16, where a llama.cpp file would quantize them too).
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from atlas_core.backends.memory import available_memory, weight_itemsize
from atlas_core.errors import ModelLoadError
from atlas_core.weights.gguf_quantized import FORMATS, QTYPES
from atlas_core.weights.nvfp4 import NVFP4
from atlas_core.weights.quant_config import QuantizationScheme
from atlas_core.weights.random_source import GGUF_TYPE_KEY, quantizable

PRESETS: dict[str, dict[str, Any]] = json.loads(resources.files(__package__).joinpath("presets.json").read_text())
"""Shapes of real models: their published config.json values that matter here (``presets.json``)."""

QUANTIZATION_CONFIGS: dict[str, dict[str, Any]] = {
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
}
"""``--quantization`` -> the ``quantization_config`` written into the random model's config.json."""
QUANTIZED_BYTES = {
    "fp8": 1 + 4 / 128**2,
    "nvfp4": 0.5625,
    **{name: GGML_QUANT_SIZES[qtype][1] / GGML_QUANT_SIZES[qtype][0] for name, qtype in QTYPES.items()},
}
"""Bytes per quantized weight element (scales included) of each ``--quantization``."""
QUANTIZATIONS = (*QUANTIZATION_CONFIGS, *QTYPES)
"""Every ``--quantization`` name."""
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


def declared_quantization(config: dict[str, Any]) -> str | None:
    """The ``--quantization`` name of what ``config`` (a config.json) declares: ``fp8``, ``nvfp4``, a GGUF block
    format of a random model (`GGUF_TYPE_KEY`) or None."""
    if GGUF_TYPE_KEY in config:
        return FORMATS[GGMLQuantizationType[config[GGUF_TYPE_KEY]]]
    scheme = QuantizationScheme.from_config(config)
    return None if scheme is None else "nvfp4" if scheme.format == NVFP4 else "fp8"


def check_fits(
    name: str,
    shapes: dict[str, tuple[int, ...]],
    backend: Any,
    layers: int,
    reserve: int = 0,
    ranks: int = 1,
    quantization: str | None = None,
) -> None:
    """A `ModelLoadError` saying so when the weights of ``shapes``, stored in the backend's weight
    dtype (``quantization``'s bytes for the weights it quantizes; plus, on the host, one tensor's bf16 copy
    while it is converted), and ``reserve`` bytes (a host KV cache) exceed the free memory
    (`available_memory`). On a device, each of ``ranks`` ranks (one device each) holds an equal share of the
    weights; host ranks share the host's memory."""
    available = available_memory(backend)
    if available is None:
        return
    itemsize = weight_itemsize(backend)
    sizes = [math.prod(shape) for shape in shapes.values()]
    on_device = backend.device_memory() is not None
    block = GGML_QUANT_SIZES[QTYPES[quantization]][0] if quantization in QTYPES else 16
    stored = sum(
        math.prod(shape)
        * (QUANTIZED_BYTES[quantization] if quantization and quantizable(n, shape, block) else itemsize)
        for n, shape in shapes.items()
    )
    needed = int(stored) // (ranks if on_device else 1) + (0 if on_device else 2 * max(sizes))
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
    reference: str,
    *,
    backend: str | None = None,
    num_layers: int | None = None,
    quantization: str | None = None,
    **engine_args: Any,
) -> Any:
    """An `LLM` over a model of ``reference``'s shape with random weights (no tokenizer: prompts are ids),
    cut to its first ``num_layers`` layers when given (`cut_layers`), its decoder layers' linear weights in
    ``quantization`` (`QUANTIZATION_CONFIGS`) when given, split over ranks as ``engine_args`` say; `check_fits`
    first (each rank holds about its share of the weights)."""
    from atlas_core.backends.select import select_backend
    from atlas_core.engine.config import EngineConfig, kv_budget
    from atlas_core.engine.llm import LLM
    from atlas_core.plugins import get_registry

    name, config = load_config(reference)
    if num_layers is not None:
        config = cut_layers(config, num_layers)
        name = f"{name}, {num_layers} layer{'s' if num_layers > 1 else ''}"
    if quantization is not None:
        if quantization in QTYPES:
            config = copy.deepcopy(config) | {GGUF_TYPE_KEY: QTYPES[quantization].name}
        else:
            config = copy.deepcopy(config) | {"quantization_config": QUANTIZATION_CONFIGS[quantization]}
        name = f"{name}, {quantization}"
    engine_config = EngineConfig(**engine_args)
    registry = get_registry()
    chosen = select_backend(registry, backend)
    registration = registry.find("model", config.get("model_type", ""))
    if registration is None:
        raise ModelLoadError(
            f"--random-weights {reference}: no installed family plugin for model_type {config.get('model_type')!r}"
        )
    shapes = registration.load().checkpoint_shapes(config)
    host_kv = kv_budget(chosen, engine_config)[0] if chosen.device_memory() is None else 0
    world = engine_config.replica_settings().world
    check_fits(name, shapes, chosen, layer_count(config), host_kv, world, quantization or declared_quantization(config))
    folder = tempfile.TemporaryDirectory(prefix="atlas-random-weights-")
    model_dir = Path(folder.name) / name
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    try:
        llm = LLM(str(model_dir), backend=chosen, **(engine_args | {"load_format": "dummy"}))
    except BaseException:
        folder.cleanup()
        raise
    weakref.finalize(llm, folder.cleanup)  # the config stays readable while the LLM (and its ranks) live
    return llm
