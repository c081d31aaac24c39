"""Loading a model end to end: resolve the reference, read config and weights, pick the family
plugin, build the model on the backend, and load the tokenizer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from atlas_core.backends.base import Backend
from atlas_core.backends.memory import available_memory, weight_itemsize
from atlas_core.errors import ModelLoadError, UnsupportedArchitectureError
from atlas_core.model.resolve import ResolvedModel, read_json_object, resolve_model
from atlas_core.model.sharding import TensorParallel
from atlas_core.model.transformer import TransformerModel
from atlas_core.plugins import PluginRegistry
from atlas_core.tokenizer import Tokenizer
from atlas_core.weights.random_source import RandomWeightSource
from atlas_core.weights.source import WeightSource

if TYPE_CHECKING:
    from atlas_core.weights.gguf import GGUFSource

LoadFormat = Literal["auto", "dummy"]
"""How weights are read: ``auto``, from the checkpoint; ``dummy``, random values in the shapes the
checkpoint's config.json implies (`RandomWeightSource`: benchmarks without a checkpoint)."""

KNOWN_FAMILY_PACKAGES = {
    "llama": "atlas-model-llama",
    "mistral": "atlas-model-llama",
    "qwen2": "atlas-model-llama",
    "qwen3": "atlas-model-qwen3",
    "qwen3_moe": "atlas-model-qwen3-moe",
    "gemma3_text": "atlas-model-gemma",
    "gemma4_text": "atlas-model-gemma",
    "gemma3": "atlas-model-gemma",
    "gemma4": "atlas-model-gemma",
    "deepseek_v3": "atlas-model-deepseek",
    "mistral4": "atlas-model-deepseek",
    "minimax_m2": "atlas-model-minimax",
    "qwen3_next": "atlas-model-qwen3-next",
    "qwen3_5": "atlas-model-qwen3-next",
    "qwen3_5_moe": "atlas-model-qwen3-next",
    "qwen3_5_text": "atlas-model-qwen3-next",
    "qwen3_5_moe_text": "atlas-model-qwen3-next",
    "qwen3_vl": "atlas-model-qwen3-vl",
    "qwen3_vl_moe": "atlas-model-qwen3-vl",
    "mistral3": "atlas-model-deepseek",
    "nemotron_h": "atlas-model-nemotron-h",
}


@dataclass
class LoadedModel:
    """A model ready to run, with what the engine and server need to know about it."""

    name: str
    resolved: ResolvedModel
    config: dict[str, Any]
    model: TransformerModel
    tokenizer: Tokenizer | None
    family_defaults: dict[str, Any]
    source: WeightSource | None = None
    """Where the weights came from, when it is not reopened from ``resolved`` (random weights)."""


def keep_gguf_blocks(source: GGUFSource, backend: Backend, gguf_weights: str) -> bool:
    """Whether ``source``'s block-quantized weights stay in their blocks: ``quantized`` yes, ``float`` no,
    ``auto`` when their copy in the backend's weight dtype would take more than half of the free memory
    (a small model runs faster from floats on the NumPy backend; a large one only fits in its blocks)."""
    if gguf_weights != "auto":
        return gguf_weights == "quantized"
    available = available_memory(backend)
    return available is not None and source.quantized_elements() * weight_itemsize(backend) > available[0] // 2


def open_source(resolved: ResolvedModel) -> WeightSource:
    if resolved.kind == "gguf":
        from atlas_core.weights.gguf import GGUFSource

        return GGUFSource(resolved.path)
    from atlas_core.weights.safetensors_source import SafetensorsSource

    return SafetensorsSource(resolved.path)


def load_tokenizer(resolved: ResolvedModel, source: WeightSource) -> Tokenizer | None:
    """The model's tokenizer: a GGUF file's own (read through ``source`` when it is the file's
    `GGUFSource`, else from the file), or the one in a model folder (None when it has none)."""
    if resolved.kind == "gguf":
        from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf
        from atlas_core.weights.gguf import GGUFSource

        return build_tokenizer_from_gguf(source if isinstance(source, GGUFSource) else resolved.path)
    return Tokenizer.from_folder(resolved.path)


def load_model(
    reference: str | os.PathLike[str] | None,
    backend: Backend,
    registry: PluginRegistry,
    *,
    max_positions: int | None = None,
    gguf_weights: str = "auto",
    parallel: TensorParallel | None = None,
    load_format: LoadFormat = "auto",
) -> LoadedModel:
    """Load ``reference`` (see `resolve_model`) onto ``backend`` with the family registered for it.

    ``max_positions``: the longest sequence the engine will run (None: the model's whole context);
    per-position tables such as RoPE's are built only that long. ``gguf_weights``: how a GGUF file's
    block-quantized weights are held (`keep_gguf_blocks`). ``parallel``: this rank's shard plan and
    communicator when the model is split over ranks (the family must support it). ``load_format``:
    ``dummy`` reads only the folder's config.json and builds the model from random weights."""
    resolved = resolve_model(reference)
    if load_format == "dummy":
        config = read_folder_config(resolved)
        loader_class, registration = family_loader(config, resolved, registry, parallel)
        source: WeightSource = RandomWeightSource.for_loader(config, loader_class)
    else:
        source = open_source(resolved)
        if resolved.kind == "gguf":
            from atlas_core.weights.gguf import GGUFSource

            assert isinstance(source, GGUFSource)
            source.keep_quantized = keep_gguf_blocks(source, backend, gguf_weights)
        loader_class, registration = family_loader(source.config, resolved, registry, parallel)
    model = loader_class(source, backend, registry, str(resolved.path), max_positions, parallel).build()
    dummy = load_format == "dummy"
    return LoadedModel(
        name=f"{resolved.name} (random weights)" if dummy else resolved.name,
        resolved=resolved,
        config=source.config,
        model=model,
        tokenizer=load_tokenizer(resolved, source),
        family_defaults=dict(registration.metadata.get("defaults", {})),
        source=source if dummy else None,
    )


def read_folder_config(resolved: ResolvedModel) -> dict[str, Any]:
    """The config.json of a model folder (what ``load_format="dummy"`` reads); `ModelLoadError` otherwise."""
    path = resolved.path / "config.json"
    if resolved.kind != "folder" or not path.is_file():
        raise ModelLoadError(f"{resolved.path}: load_format dummy needs a model folder with a config.json")
    return read_json_object(path)


def family_loader(
    config: dict[str, Any], resolved: ResolvedModel, registry: PluginRegistry, parallel: TensorParallel | None
) -> tuple[Any, Any]:
    """``(loader class, registration)`` of the family plugin for ``config``'s ``model_type``; a clear error when
    none is installed, or when it cannot split the model as ``parallel`` asks."""
    model_type = config.get("model_type")
    if not model_type:
        raise ModelLoadError(f"{resolved.path}: config has no 'model_type'; cannot tell which model family it is")
    registration = registry.find("model", model_type)
    if registration is None:
        installed = ", ".join(registry.names("model")) or "none"
        package = KNOWN_FAMILY_PACKAGES.get(model_type)
        hint = f"install {package}" if package else "no known Atlas package supports it yet"
        raise UnsupportedArchitectureError(
            f"{resolved.path}: model_type {model_type!r} ({', '.join(config.get('architectures') or [])}) "
            f"has no installed family plugin ({hint}); installed families: {installed}"
        )
    loader_class = registration.load()
    if parallel is not None and parallel.plan.tensor_split and not loader_class.supports_tensor_parallel:
        raise ModelLoadError(
            f"{resolved.path}: the {model_type!r} family ({registration.target}) cannot split a model by tensor "
            "parallelism yet; run it with tensor_parallel_size=1"
            + (" (expert_parallel_size alone splits its experts)" if loader_class.supports_expert_parallel else "")
        )
    if parallel is not None and parallel.plan.is_split and not loader_class.supports_expert_parallel:
        raise ModelLoadError(
            f"{resolved.path}: the {model_type!r} family ({registration.target}) cannot split a model over ranks "
            "yet; run it unsplit (tensor_parallel_size=1, expert_parallel_size=1)"
        )
    return loader_class, registration
