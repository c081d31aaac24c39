#!/usr/bin/env python
"""Generate the tiny NVFP4 checkpoints: ``tests/fixtures/nvfp4/<name>`` folders of the family plugins.

A development tool (NumPy, ml_dtypes and safetensors; no torch). Each checkpoint is one of the tiny
reference checkpoints (``tests/fixtures/tiny/<source>``) quantized as the two published NVFP4 layouts
store weights (docs/quantization.md), every linear weight except the embedding, the LM head and the MoE
router (`atlas_core.weights.nvfp4.quantize_nvfp4`: per group of 16 the scale is the group's absolute
maximum / 6 in units of the global scale, rounded to E4M3; elements rounded to the nearest E2M1):

* compressed-tensors ``nvfp4-pack-quantized`` (llm-compressor): ``weight_packed``, ``weight_scale``,
  ``weight_global_scale = 448 * 6 / amax`` (a divisor), shared by the projections the model fuses (Q/K/V,
  gate/up), as llm-compressor does; the W4A4 scheme adds ``input_global_scale`` (not applied);
* ModelOpt ``NVFP4``: ``weight`` (packed), ``weight_scale``, ``weight_scale_2 = amax / (448 * 6)`` per
  tensor (so fused projections have different global scales), ``input_scale`` (not applied), with
  ``hf_quant_config.json`` (and, for some, a ``quantization_config`` in config.json as well).

Every other tensor is stored in bfloat16. There are no reference outputs: the tests compare each checkpoint
with its own dequantized weights (`atlas_core.testing.nvfp4`).

Usage::

    uv run python scripts/make_nvfp4_checkpoints.py            # (re)write every folder
    uv run python scripts/make_nvfp4_checkpoints.py --check    # exit 1 unless the committed files match

Output is deterministic: the same source gives the same bytes.
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

from atlas_core.weights.nvfp4 import E2M1_MAX, E4M3_MAX, GROUP, quantize_nvfp4
from atlas_core.weights.safetensors_source import SafetensorsSource

REPO_ROOT = Path(__file__).resolve().parent.parent
BF16 = np.dtype(ml_dtypes.bfloat16)
NOT_QUANTIZED = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight$|\.(mlp|block_sparse_moe)\.gate\.weight$")
"""Linear weights that published NVFP4 checkpoints leave unquantized: embedding, LM head, MoE router."""
FUSED = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$")
"""Projections the loaders fuse; compressed-tensors gives each fused set one global scale."""
SET_KEY = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


@dataclass(frozen=True)
class Nvfp4Spec:
    """One checkpoint: ``name`` (its folder), ``source`` (a tiny checkpoint folder relative to the
    repository), ``method`` (``"compressed-tensors"`` or ``"modelopt"``), whether it stores activation
    scales (``w4a4``), whether config.json carries the ModelOpt settings too, and what it exercises."""

    name: str
    source: str
    method: str
    description: str
    w4a4: bool = False
    modelopt_in_config: bool = False

    @property
    def folder(self) -> Path:
        return REPO_ROOT / self.source.rsplit("/tiny/", 1)[0] / "nvfp4" / self.name


SPECS = [
    Nvfp4Spec(
        "qwen3_nvfp4",
        "plugins/models/qwen3/tests/fixtures/tiny/qwen3",
        "compressed-tensors",
        "compressed-tensors nvfp4-pack-quantized (W4A4 scheme: input_global_scale present, not applied)",
        w4a4=True,
    ),
    Nvfp4Spec(
        "qwen3_nvfp4_modelopt",
        "plugins/models/qwen3/tests/fixtures/tiny/qwen3",
        "modelopt",
        "ModelOpt NVFP4 recognised by hf_quant_config.json alone; per-tensor weight_scale_2 (fused Q/K/V and "
        "gate/up parts with different global scales)",
        w4a4=True,
    ),
    Nvfp4Spec(
        "qwen3_moe_nvfp4",
        "plugins/models/qwen3-moe/tests/fixtures/tiny/qwen3_moe",
        "compressed-tensors",
        "compressed-tensors NVFP4A16 (weights only): per-expert packed experts, router and LM head in bf16",
    ),
    Nvfp4Spec(
        "qwen3_moe_nvfp4_modelopt",
        "plugins/models/qwen3-moe/tests/fixtures/tiny/qwen3_moe",
        "modelopt",
        "ModelOpt NVFP4 with quantization_config in config.json and hf_quant_config.json; per-expert experts",
        w4a4=True,
        modelopt_in_config=True,
    ),
]


def quantized(name: str, value: np.ndarray) -> bool:
    """Whether tensor ``name`` is quantized: a 2-D linear weight, not excluded, K a multiple of 16."""
    return (
        value.ndim == 2 and name.endswith(".weight") and not NOT_QUANTIZED.search(name) and value.shape[1] % GROUP == 0
    )


def global_amax(tensors: dict[str, np.ndarray], fuse: bool) -> dict[str, float]:
    """The absolute maximum each quantized tensor's global scale is computed from: its own, or (``fuse``)
    the largest of its fused set's (compressed-tensors gives Q/K/V and gate/up one global scale)."""
    amax = {name: float(np.abs(value).max()) for name, value in tensors.items()}
    if not fuse:
        return amax
    sets: dict[str, list[str]] = {}
    for name in amax:
        match = FUSED.search(name)
        if match:
            sets.setdefault(name[: match.start()] + "." + SET_KEY[match[1]], []).append(name)
    for members in sets.values():
        shared = max(amax[n] for n in members)
        amax.update(dict.fromkeys(members, shared))
    return amax


def convert(spec: Nvfp4Spec) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, np.ndarray]]:
    """``(config.json, hf_quant_config.json or None, tensors)`` of ``spec``'s checkpoint."""
    source = SafetensorsSource(REPO_ROOT / spec.source)
    values = {name: np.asarray(source.get(name), dtype=np.float32) for name in sorted(source.names())}
    weights = {name: v for name, v in values.items() if quantized(name, v)}
    ct = spec.method == "compressed-tensors"
    amax = global_amax(weights, fuse=ct)
    tensors: dict[str, np.ndarray] = {}
    unquantized = sorted(n.removesuffix(".weight") for n, v in values.items() if v.ndim == 2 and n not in weights)
    for name, value in values.items():
        if name not in weights:
            tensors[name] = value.astype(BF16)
            continue
        full = E4M3_MAX * E2M1_MAX
        global_scale = full / amax[name] if ct else amax[name] / full
        packed, scales, stored = quantize_nvfp4(value, global_scale, divide=ct)
        module = name.removesuffix(".weight")
        if ct:
            tensors |= {f"{name}_packed": packed, f"{name}_scale": scales, f"{name}_global_scale": stored}
            if spec.w4a4:
                tensors[f"{module}.input_global_scale"] = np.ones(1, np.float32)
        else:
            tensors |= {name: packed, f"{name}_scale": scales, f"{name}_scale_2": stored.reshape(())}
            tensors[f"{module}.input_scale"] = np.ones((), np.float32)
    config = dict(source.config)
    config["dtype"] = "bfloat16"
    hf_quant = None
    if ct:
        config["quantization_config"] = compressed_tensors_config(unquantized, spec.w4a4)
    else:
        settings = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": GROUP}
        settings["exclude_modules"] = unquantized
        hf_quant = {"producer": {"name": "modelopt", "version": "0.0.0"}, "quantization": settings}
        if spec.modelopt_in_config:
            config["quantization_config"] = {"quant_method": "modelopt", **settings}
    return config, hf_quant, tensors


def compressed_tensors_config(unquantized: list[str], w4a4: bool) -> dict[str, Any]:
    args = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": GROUP}
    group: dict[str, Any] = {"targets": ["Linear"], "weights": args | {"dynamic": False, "observer": "minmax"}}
    group["input_activations"] = args | {"dynamic": "local", "observer": "minmax"} if w4a4 else None
    group["format"] = "nvfp4-pack-quantized"
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": unquantized,
        "kv_cache_scheme": None,
    }


def write(spec: Nvfp4Spec, folder: Path) -> None:
    config, hf_quant, tensors = convert(spec)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if hf_quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model.safetensors").chmod(0o644)


def readme(folder: Path) -> str:
    """The README.md of one package's ``nvfp4`` folder."""
    rows = [
        f"| `{s.name}` | `{s.source.rsplit('/', 1)[1]}` | {s.description} |" for s in SPECS if s.folder.parent == folder
    ]
    depth = len(folder.relative_to(REPO_ROOT).parts)
    return "\n".join(
        [
            "# Tiny NVFP4 checkpoints",
            "",
            "Made by `scripts/make_nvfp4_checkpoints.py` from the tiny checkpoints in `../tiny` (no reference outputs:",
            f"the tests compare each with its own dequantized weights): [docs/quantization.md]({'../' * depth}"
            "docs/quantization.md).",
            "",
            "| folder | made from | what it exercises |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def stale_files() -> list[str]:
    """The committed files (checkpoints and READMEs) that differ from a regeneration, printed as found."""
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in SPECS:
            write(spec, Path(tmp) / spec.name)
            made = sorted(p.name for p in (Path(tmp) / spec.name).iterdir())
            committed = sorted(p.name for p in spec.folder.iterdir()) if spec.folder.exists() else []
            for file in sorted(set(made) | set(committed)):
                ours, theirs = spec.folder / file, Path(tmp) / spec.name / file
                if not (ours.exists() and theirs.exists() and ours.read_bytes() == theirs.read_bytes()):
                    stale.append(str(ours.relative_to(REPO_ROOT)))
    for folder in sorted({spec.folder.parent for spec in SPECS}):
        if not (folder / "README.md").exists() or (folder / "README.md").read_text() != readme(folder):
            stale.append(str((folder / "README.md").relative_to(REPO_ROOT)))
    for path in stale:
        print(f"differs from a regeneration: {path}")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed folders instead")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if not stale_files() else 1
    for spec in SPECS:
        write(spec, spec.folder)
        size = sum(f.stat().st_size for f in spec.folder.iterdir())
        print(f"{spec.folder.relative_to(REPO_ROOT)}: {size} bytes")
    for folder in sorted({spec.folder.parent for spec in SPECS}):
        (folder / "README.md").write_text(readme(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
