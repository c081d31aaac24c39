"""atlas-model-deepseek on a DeepSeek-V3 FP8 checkpoint (block-scaled, ``weight_scale_inv``): logits equal
those of the dequantized weights; every projection stays quantized except ``kv_b_proj``, whose per-head
factors are dequantized at load for the absorbed MLA form."""

from __future__ import annotations

from pathlib import Path

from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.quantized import QuantizedParity

FP8 = TinyCheckpoints(Path(__file__).parent / "fixtures" / "fp8")


class TestFp8Parity(QuantizedParity):
    """Every FP8 checkpoint of this family against its own dequantized weights."""

    checkpoints = FP8
    dequantized_at_load = ("kv_b_proj",)
    not_in_model = ("model.layers.3.",)  # the MTP layer after the 3 decoder layers
