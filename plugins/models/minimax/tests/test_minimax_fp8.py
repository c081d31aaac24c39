"""atlas-model-minimax on an FP8 checkpoint (MiniMax-M2 layout: 128 x 128 blocks, ``weight_scale_inv``,
router unquantized): logits equal those of the dequantized weights, and the weights stay quantized."""

from __future__ import annotations

from pathlib import Path

from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.quantized import QuantizedParity

FP8 = TinyCheckpoints(Path(__file__).parent / "fixtures" / "fp8")


class TestFp8Parity(QuantizedParity):
    """Every FP8 checkpoint of this family against its own dequantized weights."""

    checkpoints = FP8
