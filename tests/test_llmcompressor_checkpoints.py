"""Checkpoints quantized by the real tool, llm-compressor (``scripts/make_llmcompressor_fixtures.py``: tiny
Qwen3s in FP8_BLOCK, FP8_DYNAMIC and NVFP4A16, saved compressed by compressed-tensors), load kept quantized,
decode to the weights compressed-tensors decompresses, and give the log-probabilities transformers computes
from them."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from atlas_core import LLM
from atlas_core.testing.parity import full_prompt_logprobs
from atlas_core.weights.quant_config import FP8_E4M3, NVFP4
from atlas_core.weights.quantized import QuantizedWeight
from atlas_core.weights.safetensors_source import SafetensorsSource

BF16 = np.dtype(ml_dtypes.bfloat16)
FIXTURES = Path(__file__).parent / "fixtures" / "llmcompressor"
FORMATS = {"fp8_block": FP8_E4M3, "fp8_dynamic": FP8_E4M3, "nvfp4a16": NVFP4}
LOGPROB_TOLERANCE = {"fp8_block": 1e-4, "fp8_dynamic": 1e-4, "nvfp4a16": 1e-2}
"""compressed-tensors decompresses NVFP4 into bfloat16 (FP8 into float32): its reference weights are ours rounded
to bf16 (checked exactly below), which moves the log-probabilities by up to 5e-3."""


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_llmcompressor_checkpoints_match_transformers(name: str) -> None:
    folder = FIXTURES / name
    quantization = SafetensorsSource(folder).quantization
    assert quantization is not None and quantization.method == "compressed-tensors"
    assert quantization.format == FORMATS[name]
    llm = LLM(folder, backend="numpy", kv_cache_memory_gib=1 / 64)
    assert count_quantized(llm.loaded.model) == 8  # q/k/v fused, gate/up fused, o and down in 2 layers; not lm_head
    with np.load(folder / "reference.npz") as loaded:
        reference = dict(loaded)
    weight = SafetensorsSource(folder).get(str(reference["weight_name"]))
    tool_dtype = BF16 if str(reference["weight_dtype"]) == "bfloat16" else np.dtype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(weight, np.float32).astype(tool_dtype).astype(np.float32), reference["weight"]
    )
    got = np.asarray(full_prompt_logprobs(llm, reference["prompt"].tolist()))
    np.testing.assert_allclose(got, reference["logprobs"], atol=LOGPROB_TOLERANCE[name], rtol=0, err_msg=name)


def count_quantized(root: object) -> int:
    """How many `QuantizedWeight` objects the model holds (reached through attributes, lists and dicts)."""
    seen: set[int] = set()
    stack, found = [root], 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, np.ndarray)):
            continue
        seen.add(id(item))
        if isinstance(item, QuantizedWeight):
            found += 1
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
    return found
