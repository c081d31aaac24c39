"""atlas-model-qwen3-moe on an FP8 checkpoint (24 x 24 blocks: partial edge blocks in both axes, fused
projections re-gridded): logits equal those of the dequantized weights, the experts stay quantized, and
fused expert tensors (``experts.gate_up_proj`` + ``experts.gate_up_proj_scale_inv``) give the same model
as per-expert ones."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from atlas_core import LLM
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.quantized import QuantizedParity, prompt_logits, read_tensors, sample_prompts
from atlas_core.weights.quantized import QuantizedWeight, concat_rows, stack_experts
from atlas_core.weights.safetensors_source import SafetensorsSource

FP8 = TinyCheckpoints(Path(__file__).parent / "fixtures" / "fp8")
EXPERT = re.compile(r"^(.*\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class TestFp8Parity(QuantizedParity):
    """Every FP8 checkpoint of this family against its own dequantized weights."""

    checkpoints = FP8


def fused_expert_copy(folder: Path, destination: Path) -> Path:
    """``folder`` with each layer's per-expert FP8 tensors saved as fused banks (``experts.gate_up_proj``,
    ``experts.down_proj``) with their ``_scale_inv``, holding exactly the same values."""
    source = SafetensorsSource(folder)
    tensors = read_tensors(folder)
    banks: dict[str, dict[int, dict[str, QuantizedWeight]]] = {}
    for name in list(tensors):
        match = EXPERT.match(name)
        if match:
            quantized = source.get_quantized(name)
            assert quantized is not None
            banks.setdefault(match[1], {}).setdefault(int(match[2]), {})[match[3]] = quantized
            del tensors[name], tensors[name + "_scale_inv"]
    for prefix, experts in banks.items():
        order = sorted(experts)
        for fused, parts in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            bank = stack_experts([concat_rows([experts[e][p] for p in parts]) for e in order])
            assert isinstance(bank, QuantizedWeight)
            tensors[prefix + fused] = np.asarray(bank.data)
            tensors[prefix + fused + "_scale_inv"] = np.asarray(bank.scales)
    destination.mkdir(parents=True)
    shutil.copy(folder / "config.json", destination / "config.json")
    save_file(tensors, str(destination / "model.safetensors"))
    return destination


def test_fused_expert_banks_equal_per_expert_tensors(tmp_path: Path) -> None:
    folder = FP8 / "qwen3_moe_fp8"
    per_expert = LLM(folder, kv_cache_memory_gib=1 / 64)
    fused = LLM(fused_expert_copy(folder, tmp_path / "fused"), kv_cache_memory_gib=1 / 64)
    moe = fused.loaded.model.layers[0].ffn
    assert isinstance(moe, MoEFeedForward)
    assert isinstance(moe.experts.w_in, QuantizedWeight) and isinstance(moe.experts.w_out, QuantizedWeight)
    for prompt in sample_prompts(int(FP8.config("qwen3_moe_fp8")["vocab_size"])):
        np.testing.assert_array_equal(prompt_logits(fused, prompt), prompt_logits(per_expert, prompt))
