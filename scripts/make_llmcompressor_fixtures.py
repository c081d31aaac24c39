"""Write ``tests/fixtures/llmcompressor``: tiny Qwen3 checkpoints quantized by the real tool, llm-compressor
(``oneshot`` with a ``QuantizationModifier``, saved compressed by compressed-tensors), with the schemes target
models ship in: ``FP8_BLOCK`` (128 x 128 block scales), ``FP8_DYNAMIC`` (per-channel weight scales) and
``NVFP4A16`` (packed e2m1 pairs, fp8 group scales of 16, a global scale). Beside each, ``reference.npz``: the
log-probabilities transformers computes at every position of a fixed prompt with the weights as compressed-tensors
decompresses them, in float32 (``prompt``, ``logprobs``), and one weight as compressed-tensors decompresses it
(``weight_name``, ``weight`` in float32, ``weight_dtype``: the dtype the tool gave it).

A development-only tool (torch, transformers, llm-compressor; none is an Atlas dependency):

    python scripts/make_llmcompressor_fixtures.py [--out tests/fixtures/llmcompressor]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

SCHEMES = {"fp8_block": "FP8_BLOCK", "fp8_dynamic": "FP8_DYNAMIC", "nvfp4a16": "NVFP4A16"}
PROMPT = [5, 17, 99, 3, 42, 7, 200, 11, 64, 128]
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llmcompressor"


def base_checkpoint(folder: Path) -> None:
    """A random tiny Qwen3 (hidden 256: one 128 x 128 FP8 block per quarter of a projection) in float32."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).eval().save_pretrained(folder)


WEIGHT = "model.layers.0.self_attn.q_proj.weight"


def reference(folder: Path, base: Path) -> dict[str, np.ndarray]:
    """Every position's log-probabilities of `PROMPT` with ``folder``'s weights as decompressed (in float32
    arithmetic), and the decompressed `WEIGHT`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3ForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    compressed = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, quantization_config=CompressedTensorsConfig(run_compressed=False)
    )
    state = compressed.state_dict()
    dense = {k: v.float() for k, v in state.items() if "scale" not in k}
    model = Qwen3ForCausalLM(AutoConfig.from_pretrained(base)).eval()
    model.load_state_dict(dense, strict=True)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0]
    return {
        "prompt": np.asarray(PROMPT),
        "logprobs": torch.log_softmax(logits.float(), -1).numpy(),
        "weight_name": np.asarray(WEIGHT),
        "weight": dense[WEIGHT].numpy(),
        "weight_dtype": np.asarray(str(state[WEIGHT].dtype).removeprefix("torch.")),
    }


def main() -> None:
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        base_checkpoint(base)
        for name, scheme in SCHEMES.items():
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]))
            folder = args.out / name
            shutil.rmtree(folder, ignore_errors=True)
            model.save_pretrained(folder, save_compressed=True)
            (folder / "recipe.yaml").unlink(missing_ok=True)
            np.savez(folder / "reference.npz", **reference(folder, base))
            print(f"{name}: {scheme} -> {folder}")


if __name__ == "__main__":
    main()
