"""atlas-model-llama on FP8 checkpoints: compressed-tensors per-channel scales (llama) and quant_method
fp8 with one scale per tensor (mistral, from a bfloat16 source); logits equal those of the dequantized
weights, and the weights stay quantized in memory."""

from __future__ import annotations

from pathlib import Path

from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.quantized import QuantizedParity

FP8 = TinyCheckpoints(Path(__file__).parent / "fixtures" / "fp8")


class TestFp8Parity(QuantizedParity):
    """Every FP8 checkpoint of this family against its own dequantized weights."""

    checkpoints = FP8
