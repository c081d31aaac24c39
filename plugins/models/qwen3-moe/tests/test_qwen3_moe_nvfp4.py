"""atlas-model-qwen3-moe on NVFP4 checkpoints (compressed-tensors nvfp4-pack-quantized and ModelOpt NVFP4):
logits and greedy tokens equal those of the weights dequantized from the files, and the weights (per-expert
experts stacked into banks) stay NVFP4 in memory."""

from __future__ import annotations

from pathlib import Path

from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.nvfp4 import Nvfp4Parity


class TestNvfp4Parity(Nvfp4Parity):
    """Every NVFP4 checkpoint of this family against its own dequantized weights."""

    checkpoints = TinyCheckpoints(Path(__file__).parent / "fixtures" / "nvfp4")
