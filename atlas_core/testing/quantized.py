"""Checks for quantized (FP8) checkpoints: the oracle is the checkpoint's own dequantized weights.

A quantized checkpoint has no reference outputs of its own. Its oracle is a float32 copy whose every
quantized weight is replaced by its dequantized values (`dequantized_copy`, computed here block by
block from the files and config.json, independently of `atlas_core.weights.quantized`), run through
the ordinary float path: the quantized model's logits must equal that copy's (`LOGIT_TOLERANCE`), and
its quantized weights must stay quantized in memory (`held_quantized_elements`). A family plugin runs
both on its FP8 checkpoints with a test class::

    from atlas_core.testing.quantized import QuantizedParity

    class TestFp8Parity(QuantizedParity):
        checkpoints = TinyCheckpoints(Path(__file__).parent / "fixtures" / "fp8")
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from atlas_core import LLM, SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.weights.quantized import QuantizedWeight
from atlas_core.weights.safetensors_source import DTYPES

LOGIT_TOLERANCE = 1e-5
"""Largest |logit difference| allowed between a quantized checkpoint and its dequantized copy on the
NumPy backend (both compute with the same float32 weights; in practice they agree bit for bit)."""
PROMPT_LENGTHS = (1, 7, 19)
FP8 = "F8_E4M3"


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, Any] = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of ``folder``'s safetensors files as stored (float8 as ``float8_e4m3fn``), read with the
    file layout alone."""
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        raw = path.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        for name, info in _header(path).items():
            begin, end = info["data_offsets"]
            dtype = DTYPES[info["dtype"]]
            data = np.frombuffer(raw, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=8 + length + begin)
            tensors[name] = data.reshape(info["shape"])
    return tensors


def _declared_block(config: dict[str, Any]) -> tuple[int, int] | None:
    settings = config["quantization_config"]
    if settings.get("weight_block_size"):
        return tuple(settings["weight_block_size"])
    for group in (settings.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if weights.get("strategy") == "block":
            return tuple(weights["block_structure"])
    return None


def reference_dequantize(data: np.ndarray, scale: np.ndarray, block: tuple[int, int] | None) -> np.ndarray:
    """The published formula, block by block in float64 (exact: an E4M3 value has 4 significant bits),
    rounded once to float32. ``block`` None: one scale per tensor or per row, read off the scale's shape."""
    rows, cols = data.shape[-2:]
    lead = data.shape[:-2]
    scale = np.asarray(scale, dtype=np.float64)
    if scale.size == 1:
        scale = np.broadcast_to(scale.reshape(1), (*lead, 1, 1))
    elif scale.ndim < data.ndim:
        scale = scale.reshape(*scale.shape, *(1,) * (data.ndim - scale.ndim))
    grid_rows, grid_cols = scale.shape[-2:]
    bn, bk = block if block is not None else (-(-rows // grid_rows), -(-cols // grid_cols))
    values = data.astype(np.float64)
    out = np.empty(values.shape, dtype=np.float64)
    for i in range(grid_rows):
        for j in range(grid_cols):
            part = (..., slice(i * bn, (i + 1) * bn), slice(j * bk, (j + 1) * bk))
            out[part] = values[part] * scale[..., i, j][..., None, None]
    return out.astype(np.float32)


def dequantized_copy(folder: Path, destination: Path) -> Path:
    """A float32 copy of quantized checkpoint ``folder`` in ``destination``: every F8_E4M3 tensor replaced by
    `reference_dequantize` of it and its scale (``<name>_scale_inv`` or ``<name>_scale``), the scales
    dropped, every other tensor as float32, and config.json without its ``quantization_config``."""
    config = json.loads((folder / "config.json").read_text())
    block = _declared_block(config)
    tensors = read_tensors(folder)
    headers = {name: info for path in folder.glob("*.safetensors") for name, info in _header(path).items()}
    out: dict[str, np.ndarray] = {}
    scales = set()
    for name, info in headers.items():
        if info["dtype"] != FP8:
            continue
        scale_name = next(n for n in (name + "_scale_inv", name + "_scale") if n in tensors)
        scales.add(scale_name)
        out[name] = reference_dequantize(tensors[name], tensors[scale_name].astype(np.float32), block)
    for name, value in tensors.items():
        if name not in out and name not in scales:
            out[name] = value.astype(np.float32)
    destination.mkdir(parents=True, exist_ok=True)
    del config["quantization_config"]
    config["dtype"] = "float32"
    (destination / "config.json").write_text(json.dumps(config))
    save_file(out, str(destination / "model.safetensors"))
    return destination


def quantized_weights(model: Any) -> list[QuantizedWeight]:
    """Every distinct `QuantizedWeight` reachable from ``model`` through attributes, lists, tuples and dicts."""
    found: dict[int, QuantizedWeight] = {}
    seen: set[int] = set()
    stack = [model]
    while stack:
        value = stack.pop()
        if id(value) in seen or isinstance(value, (np.ndarray, str, bytes, int, float, type(None))):
            continue
        seen.add(id(value))
        if isinstance(value, QuantizedWeight):
            found[id(value)] = value
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            stack.extend(item for key, item in vars(value).items() if key != "backend")
    return list(found.values())


def held_quantized_elements(model: Any) -> int:
    """How many quantized elements ``model`` holds (its `QuantizedWeight`s' logical sizes)."""
    return sum(int(np.prod(w.shape)) for w in quantized_weights(model))


def stored_quantized_elements(folder: Path, except_names: tuple[str, ...] = ()) -> int:
    """How many F8_E4M3 elements ``folder``'s files store, leaving out tensors whose name contains one of
    ``except_names`` (weights a family dequantizes at load on purpose)."""
    return sum(
        int(np.prod(info["shape"]))
        for path in folder.glob("*.safetensors")
        for name, info in _header(path).items()
        if info["dtype"] == FP8 and not any(part in name for part in except_names)
    )


def prompt_logits(llm: LLM, prompt: list[int]) -> np.ndarray:
    """``[T, V]`` logits of every prompt position, from one prefill through the engine's runner."""
    engine = llm.engine
    engine.add_request("logits", None, prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    try:
        step = engine.scheduler.schedule()
        batch, _ = engine.runner.build_batch(step.chunks)
        model, backend = engine.runner.model, engine.backend
        return np.asarray(backend.to_numpy(model.compute_logits(model.forward(batch, engine.kv))), dtype=np.float32)
    finally:
        engine.abort("logits")


def sample_prompts(vocab_size: int) -> list[list[int]]:
    """Fixed random prompts, one of each of `PROMPT_LENGTHS`."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab_size, size=n).tolist() for n in PROMPT_LENGTHS]


class QuantizedParity:
    """Base of a test class over every quantized checkpoint of ``checkpoints`` (one test per checkpoint).

    ``dequantized_at_load``: substrings of the tensor names the family dequantizes at load on purpose
    (e.g. ``("kv_b_proj",)`` for MLA); ``not_in_model``: substrings of the names of tensors the model does
    not load (e.g. a multi-token-prediction layer, read only for speculative decoding); every other
    quantized tensor must stay quantized in memory."""

    checkpoints: ClassVar[TinyCheckpoints]
    dequantized_at_load: ClassVar[tuple[str, ...]] = ()
    not_in_model: ClassVar[tuple[str, ...]] = ()
    kv_cache_gib: ClassVar[float] = 1 / 64

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "checkpoint" in metafunc.fixturenames:
            metafunc.parametrize("checkpoint", self.checkpoints.names)

    def reference_copy(self, folder: Path, destination: Path) -> Path:
        """The float checkpoint the quantized one must equal (`dequantized_copy`; other formats override)."""
        return dequantized_copy(folder, destination)

    def test_logits_equal_the_dequantized_weights(self, checkpoint: str, tmp_path: Path) -> None:
        folder = self.checkpoints / checkpoint
        quantized = LLM(folder, kv_cache_memory_gib=self.kv_cache_gib)
        reference = LLM(self.reference_copy(folder, tmp_path / checkpoint), kv_cache_memory_gib=self.kv_cache_gib)
        for prompt in sample_prompts(int(self.checkpoints.config(checkpoint)["vocab_size"])):
            got, want = prompt_logits(quantized, prompt), prompt_logits(reference, prompt)
            np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_TOLERANCE, err_msg=f"{checkpoint}, {prompt}")
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        prompts = sample_prompts(int(self.checkpoints.config(checkpoint)["vocab_size"]))
        got_tokens = [o.outputs[0].token_ids for o in quantized.generate(prompts, params)]
        want_tokens = [o.outputs[0].token_ids for o in reference.generate(prompts, params)]
        assert got_tokens == want_tokens, checkpoint

    def test_quantized_weights_stay_quantized(self, checkpoint: str) -> None:
        folder = self.checkpoints / checkpoint
        llm = LLM(folder, kv_cache_memory_gib=self.kv_cache_gib)
        held = quantized_weights(llm.loaded.model)
        assert held and all(w.dtype == np.dtype(ml_dtypes.float8_e4m3fn) for w in held)
        assert all(np.asarray(w.data).dtype == w.dtype and np.asarray(w.scales).dtype == np.float32 for w in held)
        assert held_quantized_elements(llm.loaded.model) == stored_quantized_elements(
            folder, self.dequantized_at_load + self.not_in_model
        ), f"{checkpoint}: some quantized weights were dequantized at load"
