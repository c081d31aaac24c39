#!/usr/bin/env python
"""Generate the tiny FP8 checkpoints: ``tests/fixtures/fp8/<name>`` folders of the family plugins.

A development tool (NumPy, ml_dtypes and safetensors; no torch). Each FP8 checkpoint is one of the
tiny bf16/fp32 reference checkpoints (``tests/fixtures/tiny/<source>``, see docs/tiny-checkpoints.md)
quantized exactly as the published formats store weights (docs/quantization.md):

* every linear weight (2-D ``*.weight``) except the embedding, the LM head and the MoE router becomes
  float8 E4M3 elements plus float32 scales, one per block: scale = the block's absolute maximum / 448,
  element = weight / scale rounded to the nearest E4M3 value (`atlas_core.weights.quantized.quantize_fp8`);
* ``quant_method: "fp8"`` checkpoints store the scale as ``weight_scale_inv`` (block-scaled, as
  DeepSeek-V3 / Qwen3-FP8 / MiniMax-M2) or ``weight_scale`` (per tensor, no ``weight_block_size``);
  ``compressed-tensors`` ones as ``weight_scale`` in bfloat16 (per channel ``[N, 1]``, as llm-compressor);
* every other tensor is stored in bfloat16, except float32 router correction biases;
* config.json is the source's with ``dtype: "bfloat16"`` and the ``quantization_config`` of the format
  (the modules left unquantized listed in ``modules_to_not_convert`` / ``ignore``).

There are no reference outputs: the tests compare each checkpoint's logits with those of its own
dequantized weights run through the ordinary float path (`atlas_core.testing.quantized`).

Usage::

    uv run python scripts/make_fp8_checkpoints.py            # (re)write every folder
    uv run python scripts/make_fp8_checkpoints.py --check    # exit 1 unless the committed files match
    uv run python scripts/make_fp8_checkpoints.py --out DIR  # write into DIR instead

Output is deterministic (no randomness): the same source gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from atlas_core.weights.quantized import quantize_fp8
from atlas_core.weights.safetensors_source import SafetensorsSource

REPO_ROOT = Path(__file__).resolve().parent.parent
BF16 = np.dtype(ml_dtypes.bfloat16)
NOT_QUANTIZED = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight$|\.(mlp|block_sparse_moe)\.gate\.weight$")
"""Linear weights that published FP8 checkpoints leave unquantized: embedding, LM head, MoE router."""
FLOAT32_TENSORS = re.compile(r"e_score_correction_bias$")


@dataclass(frozen=True)
class Fp8Spec:
    """One FP8 checkpoint: ``name`` (its folder), ``source`` (a tiny checkpoint folder relative to the
    repository), ``method`` (``"fp8"`` or ``"compressed-tensors"``), ``block`` (rows, columns per scale)
    or ``strategy`` (``"channel"`` / ``"tensor"``), and what it exercises."""

    name: str
    source: str
    method: str
    description: str
    block: tuple[int, int] | None = None
    strategy: str = "block"

    @property
    def folder(self) -> Path:
        """Where it is written: the ``fp8`` folder beside the source's ``tiny`` folder."""
        return REPO_ROOT / self.source.rsplit("/tiny/", 1)[0] / "fp8" / self.name


SPECS = [
    Fp8Spec(
        name="qwen3_fp8",
        source="plugins/models/qwen3/tests/fixtures/tiny/qwen3",
        method="fp8",
        block=(128, 128),
        description="Qwen3-FP8 layout: blocks of 128 x 128, so every matrix is one partial (padded) block",
    ),
    Fp8Spec(
        name="llama_fp8_channel",
        source="plugins/models/llama/tests/fixtures/tiny/llama",
        method="compressed-tensors",
        strategy="channel",
        description="compressed-tensors float-quantized, one bfloat16 scale per output channel",
    ),
    Fp8Spec(
        name="mistral_fp8_tensor",
        source="plugins/models/llama/tests/fixtures/tiny/mistral",
        method="fp8",
        strategy="tensor",
        description="quant_method fp8 without weight_block_size: one float32 weight_scale per tensor",
    ),
    Fp8Spec(
        name="qwen3_moe_fp8",
        source="plugins/models/qwen3-moe/tests/fixtures/tiny/qwen3_moe",
        method="fp8",
        block=(24, 24),
        description=(
            "blocks of 24 x 24: partial edge blocks in both axes, fused Q/K/V and gate/up re-gridded to "
            "one scale row per output row; per-expert quantized experts"
        ),
    ),
    Fp8Spec(
        name="minimax_m2_fp8",
        source="plugins/models/minimax/tests/fixtures/tiny/minimax_m2",
        method="fp8",
        block=(128, 128),
        description="MiniMax-M2 layout: 128 x 128 blocks, per-expert w1/w3/w2 quantized, router and its bias not",
    ),
    Fp8Spec(
        name="deepseek_v3_fp8",
        source="plugins/models/deepseek/tests/fixtures/tiny/deepseek_v3",
        method="fp8",
        block=(16, 16),
        description=(
            "DeepSeek-V3 layout in blocks of 16 x 16: MLA projections (kv_a_proj_with_mqa has a partial "
            "row block; kv_b_proj dequantized at load), dense and shared-expert MLPs, per-expert experts"
        ),
    ),
]


def module_name(tensor: str) -> str:
    return tensor.removesuffix(".weight")


def quantization_config(spec: Fp8Spec, unquantized: list[str]) -> dict[str, Any]:
    if spec.method == "fp8":
        config: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
        if spec.block is not None:
            config["weight_block_size"] = list(spec.block)
        return config | {"modules_to_not_convert": unquantized}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": spec.strategy, "dynamic": False}
    weights |= {"group_size": None, "block_structure": None if spec.block is None else list(spec.block)}
    activations = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
                "output_activations": None,
                "format": "float-quantized",
            }
        },
        "ignore": unquantized,
        "kv_cache_scheme": None,
    }


def convert(spec: Fp8Spec) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The FP8 checkpoint of ``spec``: its config.json and tensors."""
    source = SafetensorsSource(REPO_ROOT / spec.source)
    tensors: dict[str, np.ndarray] = {}
    unquantized: list[str] = []
    for name in sorted(source.names()):
        value = np.asarray(source.get(name))
        if value.ndim == 2 and name.endswith(".weight") and not NOT_QUANTIZED.search(name):
            rows, cols = value.shape
            block = {"channel": (1, cols), "tensor": (rows, cols)}.get(spec.strategy, spec.block)
            assert block is not None, spec
            if spec.method == "fp8":
                weight = quantize_fp8(value, block)
                scale = weight.scales.reshape(1) if spec.strategy == "tensor" else weight.scales
                tensors[name] = weight.data
                tensors[name + ("_scale" if spec.block is None else "_scale_inv")] = scale
            else:
                weight = quantize_fp8(value, block, scale_dtype=BF16)
                scale = weight.scales.reshape(1) if spec.strategy == "tensor" else weight.scales
                tensors[name] = weight.data
                tensors[name + "_scale"] = scale.astype(BF16)
            continue
        if value.ndim == 2 and name.endswith(".weight"):
            unquantized.append(module_name(name))
        tensors[name] = value.astype(np.float32 if FLOAT32_TENSORS.search(name) else BF16)
    config = dict(source.config)
    config["dtype"] = "bfloat16"
    config["quantization_config"] = quantization_config(spec, unquantized)
    return config, tensors


def write(spec: Fp8Spec, folder: Path) -> None:
    config, tensors = convert(spec)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model.safetensors").chmod(0o644)


def readme(folder: Path) -> str:
    """The README.md of one package's ``fp8`` folder: every checkpoint in it and what it exercises."""
    rows = [
        f"| `{spec.name}` | `{spec.source.rsplit('/', 1)[1]}` | {spec.description} |"
        for spec in SPECS
        if spec.folder.parent == folder
    ]
    depth = len(folder.relative_to(REPO_ROOT).parts)
    return "\n".join(
        [
            "# Tiny FP8 checkpoints",
            "",
            "Made by `scripts/make_fp8_checkpoints.py` from the tiny checkpoints in `../tiny` (quantized as the",
            "published formats store weights; no reference outputs: the tests compare each with its own dequantized",
            f"weights): [docs/quantization.md]({'../' * depth}docs/quantization.md).",
            "",
            "| folder | made from | what it exercises |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed folders instead")
    parser.add_argument("--out", type=Path, help="write every folder into this directory instead")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if not stale_files() else 1
    for spec in SPECS:
        folder = args.out / spec.name if args.out else spec.folder
        write(spec, folder)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"{folder.relative_to(REPO_ROOT) if not args.out else folder}: {size} bytes")
    if not args.out:
        for folder in sorted({spec.folder.parent for spec in SPECS}):
            (folder / "README.md").write_text(readme(folder))
    return 0


def stale_files() -> list[str]:
    """The committed files (checkpoints and READMEs) that differ from a regeneration, printed as found."""
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in SPECS:
            write(spec, Path(tmp) / spec.name)
            for file in ("config.json", "model.safetensors"):
                committed = spec.folder / file
                if not committed.exists() or committed.read_bytes() != (Path(tmp) / spec.name / file).read_bytes():
                    stale.append(str(committed.relative_to(REPO_ROOT)))
    for folder in sorted({spec.folder.parent for spec in SPECS}):
        committed = folder / "README.md"
        if not committed.exists() or committed.read_text() != readme(folder):
            stale.append(str(committed.relative_to(REPO_ROOT)))
    for path in stale:
        print(f"differs from a regeneration: {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
