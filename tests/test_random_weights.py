"""Random-weight models: every family loader describes exactly the tensors it reads
(`ModelWeightLoader.checkpoint_shapes`), and a model built from random weights of that description runs.

For each plugin's tiny checkpoint the loader builds the model twice on the numpy backend through a
source that records every tensor read: once from the checkpoint's safetensors, once from random
weights of ``checkpoint_shapes(config)``. The first must read exactly the described tensors (per-expert
tensors count as their fused form, ``experts.gate_up_proj [E, 2I, W]`` / ``experts.down_proj
[E, W, I]``, which the loaders read alike); the second must read every described tensor and nothing else.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas_core.backends.select import select_backend
from atlas_core.bench import random_weights
from atlas_core.bench.random_weights import PRESETS, cut_layers, random_weights_llm
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import ModelLoadError
from atlas_core.plugins import get_registry
from atlas_core.weights.random_source import RandomWeightSource
from atlas_core.weights.safetensors_source import SafetensorsSource
from tests.conftest import REPOSITORY, TINY

PLUGIN_CHECKPOINTS = sorted(
    folder.name
    for folder in REPOSITORY.glob("plugins/models/*/tests/fixtures/tiny/*")
    if (folder / "config.json").is_file()
)
"""Every family plugin's tiny checkpoint, by name."""

PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts\.)(?P<expert>\d+)\.(?P<projection>\w+)\.weight$")
GATE, UP, DOWN = {"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}

Shapes = dict[str, tuple[int, ...]]


class RecordingSource:
    """A `WeightSource` that passes through to ``inner`` and records the shape of every tensor read."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.config = inner, inner.config
        self.read: Shapes = {}

    def names(self) -> Iterator[str]:
        return iter(self.inner.names())

    def __contains__(self, name: str) -> bool:
        return name in self.inner

    def get(self, name: str) -> np.ndarray:
        array = self.inner.get(name)
        self.read[name] = tuple(array.shape)
        return array


def fused_experts(read: Shapes) -> Shapes:
    """``read`` with per-expert tensors (``{prefix}{e}.gate_proj.weight`` ..., MiniMax's ``w1/w3/w2``)
    replaced by the fused tensors they stack into."""
    out: Shapes = {}
    banks: dict[str, dict[str, dict[int, tuple[int, ...]]]] = {}
    for name, shape in read.items():
        match = PER_EXPERT.match(name)
        if match is None:
            out[name] = shape
            continue
        projection = match["projection"]
        role = "gate" if projection in GATE else "up" if projection in UP else "down" if projection in DOWN else None
        assert role is not None, f"unknown expert projection {name}"
        banks.setdefault(match["prefix"], {}).setdefault(role, {})[int(match["expert"])] = shape
    for prefix, roles in banks.items():
        experts = len(roles["down"])
        assert all(sorted(shapes) == list(range(experts)) for shapes in roles.values()), f"{prefix}: experts missing"
        (inter, width), down = roles["up"][0], roles["down"][0]
        assert down == (width, inter)
        if "gate" in roles:
            out[prefix + "gate_up_proj"] = (experts, 2 * inter, width)
        else:
            out[prefix + "up_proj"] = (experts, inter, width)
        out[prefix + "down_proj"] = (experts, width, inter)
    return out


def loader_class(config: dict[str, Any]) -> Any:
    registration = get_registry().find("model", config["model_type"])
    assert registration is not None, config["model_type"]
    return registration.load()


def tensors_read(source: Any) -> Shapes:
    """Build the model of ``source`` on the numpy backend; the tensors its loader read."""
    recording = RecordingSource(source)
    registry = get_registry()
    loader_class(source.config)(recording, select_backend(registry, "numpy"), registry, "test", 64).build()
    return recording.read


def difference(described: Shapes, read: Shapes) -> str:
    lines = [f"described, not read: {name} {shape}" for name, shape in described.items() if name not in read]
    lines += [f"read, not described: {name} {shape}" for name, shape in read.items() if name not in described]
    lines += [
        f"{name}: described {described[name]}, read {read[name]}"
        for name in described.keys() & read.keys()
        if described[name] != read[name]
    ]
    return "\n".join(sorted(lines))


@pytest.mark.parametrize("name", PLUGIN_CHECKPOINTS)
def test_checkpoint_shapes_are_what_the_loader_reads(name: str) -> None:
    folder: Path = TINY / name
    config = TINY.config(name)
    described = loader_class(config).checkpoint_shapes(config)
    read = fused_experts(tensors_read(SafetensorsSource(folder)))
    assert described == read, difference(described, read)


@pytest.mark.parametrize("name", PLUGIN_CHECKPOINTS)
def test_random_weights_are_read_whole(name: str) -> None:
    TINY / name  # skips when the family is not installed
    config = TINY.config(name)
    described = loader_class(config).checkpoint_shapes(config)
    read = tensors_read(RandomWeightSource(config, described))
    assert read == described, difference(described, read)


@pytest.mark.parametrize("name", PLUGIN_CHECKPOINTS)
def test_random_weight_model_generates(name: str) -> None:
    llm = random_weights_llm(str(TINY / name), backend="numpy", kv_cache_memory_gib=1 / 16, max_seq_len=64)
    outputs = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 4


PUBLISHED_BILLIONS = {
    "llama-3-8b": 8.0,
    "qwen3-0.6b": 0.6,
    "qwen3-30b-a3b": 30.5,
    "qwen3.5-35b-a3b": 35.0,
    "qwen3-next-80b-a3b": 80.0,
    "nemotron-3-nano-30b-a3b": 31.6,
    "mistral-small-4": 119.0,
    "deepseek-v3": 671.0,
    "minimax-m2": 230.0,
    "gemma-4-26b-a4b": 25.2,
}
"""Total parameters the model cards give (vision towers and MTP layers, which are not built, within 2%)."""


def test_every_preset_has_its_published_size() -> None:
    assert set(PRESETS) == set(PUBLISHED_BILLIONS)
    for name, config in PRESETS.items():
        shapes = loader_class(config).checkpoint_shapes(config)
        billions = sum(math.prod(shape) for shape in shapes.values()) / 1e9
        assert billions == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.02), name


def test_cut_layers_keeps_per_layer_settings_of_the_kept_layers() -> None:
    gemma4 = cut_layers(TINY.config("gemma4"), 4)  # layers 3 and 4 share KV; layer 4 has its own head shape
    assert gemma4["num_hidden_layers"] == 4 and len(gemma4["layer_types"]) == 4
    assert list(gemma4["per_layer_config"]) == ["2"] and gemma4["num_kv_shared_layers"] == 1
    nemotron = cut_layers(PRESETS["nemotron-3-nano-30b-a3b"], 2)
    assert (nemotron["num_hidden_layers"], nemotron["hybrid_override_pattern"]) == (2, "ME")
    qwen = cut_layers(PRESETS["qwen3.5-35b-a3b"], 3)
    assert (
        qwen["text_config"]["num_hidden_layers"] == 3
        and PRESETS["qwen3.5-35b-a3b"]["text_config"]["num_hidden_layers"] == 40
    )
    with pytest.raises(ModelLoadError, match="--num-layers 41: the model has 40 layers"):
        cut_layers(PRESETS["qwen3.5-35b-a3b"], 41)


@pytest.mark.parametrize(("name", "layers"), [("gemma4", 3), ("qwen3_5", 1), ("nemotron_h", 1), ("deepseek_v3", 2)])
def test_a_cut_model_generates(name: str, layers: int) -> None:
    """Cuts before Gemma 4's KV-shared layers (a cut through them would make the last one full
    attention, which Gemma 4 forces), and down to recurrent layers only (qwen3_5, nemotron_h: no KV cache)."""
    llm = random_weights_llm(str(TINY / name), backend="numpy", num_layers=layers, kv_cache_memory_gib=1 / 16)
    assert len(llm.loaded.model.layers) == layers
    outputs = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 3


def test_a_shape_too_large_for_memory_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random_weights, "available_memory", lambda backend: (1000, "available host memory"))
    folder = str(TINY / "qwen3_next")
    with pytest.raises(ModelLoadError, match=r"weights take 0\.0 GB as numpy weights \(4 bytes each\).*lower --num"):
        random_weights_llm(folder, backend="numpy", kv_cache_memory_gib=1 / 16)
    with pytest.raises(ModelLoadError, match="one layer is the fewest .the embedding and LM head alone take"):
        random_weights_llm(folder, backend="numpy", num_layers=1, kv_cache_memory_gib=1 / 16)


def test_dummy_load_format_needs_a_folder_with_a_config(tmp_path: Path) -> None:
    from atlas_core.model.load import load_model

    registry = get_registry()
    backend = select_backend(registry, "numpy")
    with pytest.raises(ModelLoadError, match="load_format dummy needs a model folder with a config.json"):
        load_model(tmp_path, backend, registry, load_format="dummy")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="config.json: expected a JSON object"):
        load_model(tmp_path, backend, registry, load_format="dummy")
    (tmp_path / "config.json").write_text(json.dumps(TINY.config("qwen3")))
    loaded = load_model(tmp_path, backend, registry, load_format="dummy")  # no weight file in the folder
    assert loaded.name == f"{tmp_path.name} (random weights)" and loaded.tokenizer is None


@pytest.mark.parametrize("quantization", ["fp8", "nvfp4", "gguf_q4_0", "gguf_q8_0"])
@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "nemotron_h"])
def test_random_quantized_weights_are_the_format_a_checkpoint_holds(name: str, quantization: str) -> None:
    """``--quantization``: the decoder layers' linear weights (expert banks included) are random FP8, NVFP4 or GGUF
    blocks kept quantized by the backend, routers, norms, embeddings and the LM head stay bf16, and the model
    generates; the same name gives the same values in every process (here: twice)."""
    from atlas_core.testing.quantized import quantized_weights
    from atlas_core.weights.nvfp4 import NVFP4
    from atlas_core.weights.quantized import FP8_E4M3

    settings = {"backend": "numpy", "kv_cache_memory_gib": 1 / 16, "max_seq_len": 64, "quantization": quantization}
    llm = random_weights_llm(str(TINY / name), **settings)
    held = quantized_weights(llm.loaded.model)
    formats = {w.format for w in held}
    assert held and formats == {
        FP8_E4M3 if quantization == "fp8" else NVFP4 if quantization == "nvfp4" else quantization
    }
    source = llm.loaded.source
    assert isinstance(source, RandomWeightSource)
    from atlas_core.bench.header import checkpoint_dtypes

    assert f"decoder linear weights {quantization}" in checkpoint_dtypes(llm.loaded)
    kept = [n for n in source.names() if source.get_quantized(n) is None]
    block = 32 if quantization.startswith("gguf_") else 16  # GGUF rows hold whole blocks, or stay bf16
    assert not any(n.endswith("proj.weight") and source.shape(n)[-1] % block == 0 for n in kept if ".layers." in n)
    for part in ("embed", "norm", *(("lm_head",) if name != "llama" else ()), *((".gate.",) if "moe" in name else ())):
        assert any(part in n for n in kept), f"{part} tensors must stay bf16"
    assert all(source.shape(n) == tuple(source.get(n).shape) for n in list(source.names())[:8])
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    first = llm.generate([[1, 2, 3, 4, 5]], params)[0].outputs[0].token_ids
    again = random_weights_llm(str(TINY / name), **settings).generate([[1, 2, 3, 4, 5]], params)
    assert len(first) == 4 and again[0].outputs[0].token_ids == first


def test_random_gguf_weights_are_whole_blocks_of_the_pool() -> None:
    """K-quant random weights: runs of whole blocks (a name's always the same), only where rows hold whole
    256-element super-blocks; the values stay below 1."""
    from gguf import GGMLQuantizationType as Q

    from atlas_core.weights.quantized import dequantize
    from atlas_core.weights.random_source import GGUF_TYPE_KEY, gguf_pool

    shapes = {"model.layers.0.mlp.down_proj.weight": (48, 512), "model.layers.0.mlp.up_proj.weight": (48, 96)}
    source = RandomWeightSource({GGUF_TYPE_KEY: "Q4_K"}, shapes)
    weight = source.get_quantized("model.layers.0.mlp.down_proj.weight")
    assert weight is not None and weight.format == "gguf_q4_k" and weight.data.shape == (48, 2 * 144)
    assert source.get_quantized("model.layers.0.mlp.up_proj.weight") is None  # 96 columns: not whole super-blocks
    again = RandomWeightSource({GGUF_TYPE_KEY: "Q4_K"}, shapes).get_quantized("model.layers.0.mlp.down_proj.weight")
    assert again is not None and np.array_equal(again.data, weight.data)
    blocks = gguf_pool(source.seed, Q.Q4_K).reshape(-1, 144)
    assert all((blocks == block).all(axis=1).any() for block in weight.data.reshape(-1, 144)[:4])
    assert 0.001 < float(np.abs(dequantize(weight)).max()) < 1.0


def test_quantization_needs_random_weights() -> None:
    from atlas_core.cli import main

    assert main(["bench", "latency", str(TINY / "llama"), "--quantization", "fp8", "--backend", "numpy"]) == 2
