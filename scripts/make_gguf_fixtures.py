#!/usr/bin/env python
"""Generate the tiny block-quantized GGUF files in ``tests/fixtures/gguf`` (NumPy and gguf; no torch).

* ``llama_q8_0``, ``llama_q4_0`` (``llama`` architecture: llama.cpp's Q/K row interleave), ``qwen2_q4_1``,
  ``qwen2_q5_0`` (Q/K/V biases), ``qwen3_q5_1`` (Q/K norms), ``qwen3moe_q8_0`` (``qwen3moe``: a dense layer
  and MoE layers, experts stacked into banks): the tiny reference checkpoints of the llama, qwen3 and qwen3-moe
  family plugins (docs/tiny-checkpoints.md) converted as llama.cpp's converter does (HF names to GGUF names,
  Q/K rows interleaved for ``llama``), every 2-D weight and expert bank quantized by `gguf.quants.quantize`
  and 1-D tensors kept in F32.
* ``llama_k_mix``: a llama-architecture model of 2 layers with 256-wide rows (K-quant super-blocks hold
  256 elements, wider than the tiny checkpoints' rows) in a Q4_K_M-like mix of Q4_K, Q5_K and Q6_K
  (including a layer whose V projection is Q6_K while Q and K are Q4_K, and a Q6_K output head). The
  ``gguf`` package cannot quantize K-quants, so their blocks are random bytes whose f16 super-block
  scales (``d``, and ``dmin`` for Q4_K / Q5_K: values are linear in them) are set so that each block
  spans a chosen absolute maximum. The tests compare logits with the same file read as floats, so the
  values only need to be finite and of a sensible size.

Each file carries a byte-level GPT-2 tokenizer of 256 byte tokens (no merges), so `atlas_core.LLM` loads it.

Usage::

    uv run python scripts/make_gguf_fixtures.py            # (re)write every file
    uv run python scripts/make_gguf_fixtures.py --check    # exit 1 unless the committed files match

Output is deterministic (seeded randomness).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from atlas_core.weights.gguf import _BLOCK_TENSORS, _GLOBAL_TENSORS

REPOSITORY = Path(__file__).resolve().parent.parent
OUT = REPOSITORY / "tests" / "fixtures" / "gguf"
TINY = {
    "llama": REPOSITORY / "plugins/models/llama/tests/fixtures/tiny/llama",
    "qwen2": REPOSITORY / "plugins/models/llama/tests/fixtures/tiny/qwen2",
    "qwen3": REPOSITORY / "plugins/models/qwen3/tests/fixtures/tiny/qwen3",
    "qwen3_moe": REPOSITORY / "plugins/models/qwen3-moe/tests/fixtures/tiny/qwen3_moe",
}
GGUF_ARCH = {"qwen3_moe": "qwen3moe"}
"""HF model_type -> llama.cpp's architecture name, where they differ."""
EXPERT_BANKS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
"""HF per-expert projection -> llama.cpp's bank of every expert ``[E, out, in]``."""
FROM_TINY: dict[str, tuple[str, Q]] = {
    "llama_q8_0": ("llama", Q.Q8_0),
    "llama_q4_0": ("llama", Q.Q4_0),
    "qwen2_q4_1": ("qwen2", Q.Q4_1),
    "qwen2_q5_0": ("qwen2", Q.Q5_0),
    "qwen3_q5_1": ("qwen3", Q.Q5_1),
    "qwen3moe_q8_0": ("qwen3_moe", Q.Q8_0),
}
NAMES = (*FROM_TINY, "llama_k_mix")
K_MIX_LAYERS: list[dict[str, Q]] = [
    {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q4_K, "attn_output": Q.Q5_K}
    | {"ffn_gate": Q.Q5_K, "ffn_up": Q.Q5_K, "ffn_down": Q.Q6_K},
    {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K}
    | {"ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K},
]
"""Per layer of ``llama_k_mix``: GGUF tensor stem -> type."""
K_MIX = {"hidden": 256, "ffn": 256, "heads": 4, "kv_heads": 2, "vocab": 256}
_GGUF_NAMES = {hf: gguf_name for gguf_name, hf in _GLOBAL_TENSORS.items()}
_GGUF_BLOCK_NAMES = {hf: gguf_name for gguf_name, hf in _BLOCK_TENSORS.items()}


def _gguf_name(hf_name: str) -> str:
    stem, _, suffix = hf_name.rpartition(".")
    if stem in _GGUF_NAMES:
        return f"{_GGUF_NAMES[stem]}.{suffix}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{_GGUF_BLOCK_NAMES[part]}.{suffix}"


def _interleave_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation of Q/K rows (convert_hf_to_gguf.py ``permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins of the 256 bytes (``bytes_to_unicode``), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def gguf_writer(path: Path, arch: str, config: dict[str, int | float]) -> gguf.GGUFWriter:
    """A writer with a model's metadata (``config``: layers, hidden, ffn, heads, kv_heads, head_dim, eps,
    theta, vocab) and a 256-byte-token GPT-2 tokenizer; add tensors, then `finish`."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(int(config["layers"]))
    writer.add_context_length(512)
    writer.add_embedding_length(int(config["hidden"]))
    writer.add_feed_forward_length(int(config["ffn"]))
    writer.add_head_count(int(config["heads"]))
    writer.add_head_count_kv(int(config["kv_heads"]))
    writer.add_key_length(int(config["head_dim"]))
    writer.add_value_length(int(config["head_dim"]))
    writer.add_layer_norm_rms_eps(float(config["eps"]))
    writer.add_rope_freq_base(float(config["theta"]))
    writer.add_vocab_size(int(config["vocab"]))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(_byte_tokens())
    writer.add_token_types([1] * 256)
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    return writer


def finish(writer: gguf.GGUFWriter) -> None:
    """Write the header, metadata and tensors, and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_from_tiny(name: str, path: Path) -> None:
    """``FROM_TINY[name]``: a tiny reference checkpoint as a GGUF file with its 2-D weights quantized."""
    source, qtype = FROM_TINY[name]
    write_checkpoint(TINY[source], path, qtype)


def write_checkpoint(folder: Path, path: Path, qtype: Q | None) -> None:
    """The HF checkpoint in ``folder`` as a GGUF file, as llama.cpp's converter writes it: its 2-D weights and
    expert banks (each projection's experts stacked ``[E, out, in]``) as ``qtype`` (None: F32), 1-D tensors F32."""
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf_writer(
        path,
        GGUF_ARCH.get(config["model_type"], config["model_type"]),
        {
            "layers": config["num_hidden_layers"],
            "hidden": config["hidden_size"],
            "ffn": config["intermediate_size"],
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": config["head_dim"],
            "eps": config["rms_norm_eps"],
            "theta": config["rope_parameters"]["rope_theta"],
            "vocab": config["vocab_size"],
        },
    )
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(int(config["num_experts_per_tok"]))
        writer.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))
    arrays: dict[str, np.ndarray] = {}
    for hf_name in sorted(tensors):
        values = np.asarray(tensors[hf_name], dtype=np.float32)
        if config["model_type"] == "llama" and ".q_proj." in hf_name:
            values = _interleave_rows(values, heads)
        if config["model_type"] == "llama" and ".k_proj." in hf_name:
            values = _interleave_rows(values, kv_heads)
        parts = hf_name.split(".")
        if ".mlp.experts." in hf_name:  # model.layers.L.mlp.experts.E.<proj>.weight, stacked below
            bank = f"blk.{parts[2]}.{EXPERT_BANKS[parts[6]]}.weight"
            arrays[bank] = np.concatenate([arrays[bank], values[None]]) if bank in arrays else values[None]
        else:
            arrays[_gguf_name(hf_name)] = values
    for gguf_name, values in arrays.items():
        if values.ndim >= 2 and qtype is not None:
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, values)
    finish(writer)


def k_quant_blocks(rng: np.random.Generator, qtype: Q, shape: tuple[int, int], amax: float) -> np.ndarray:
    """Random ``qtype`` blocks for a ``shape`` tensor (uint8 ``[rows, row bytes]``), each block's f16
    scales set so that its values span about ``amax`` (decoded by `gguf.quants.dequantize`)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (shape[0] * shape[1] // block_size, type_size), dtype=np.uint8)
    scale_fields: dict[Q, Callable[[np.ndarray], np.ndarray]] = {
        Q.Q4_K: lambda b: b[:, 0:4],  # d, dmin
        Q.Q5_K: lambda b: b[:, 0:4],  # d, dmin
        Q.Q6_K: lambda b: b[:, type_size - 2 :],  # d
    }
    fields = scale_fields[qtype]
    n_scales = fields(blocks).shape[1] // 2
    fields(blocks)[:] = np.ones((len(blocks), n_scales), dtype=np.float16).view(np.uint8)
    unit = np.abs(gguf.quants.dequantize(blocks, qtype)).max(axis=1)
    factor = (amax * rng.uniform(0.5, 1.5, len(blocks)) / np.maximum(unit, 1e-3)).astype(np.float16)
    patched = blocks.copy()
    scales = np.repeat(factor[:, None], n_scales, axis=1)
    if qtype == Q.Q6_K:
        patched[:, type_size - 2 :] = scales.view(np.uint8)
    else:
        patched[:, 0:4] = scales.view(np.uint8)
    return patched.reshape(shape[0], -1)


def write_k_mix(path: Path) -> None:
    """``llama_k_mix``: see the module docstring."""
    rng = np.random.default_rng(0)
    hidden, ffn, heads, kv_heads, vocab = (K_MIX[k] for k in ("hidden", "ffn", "heads", "kv_heads", "vocab"))
    head_dim = hidden // heads
    config = {"layers": len(K_MIX_LAYERS), "head_dim": head_dim, "eps": 1e-6, "theta": 10000.0} | K_MIX
    writer = gguf_writer(path, "llama", config)
    shapes = {
        "attn_q": (heads * head_dim, hidden),
        "attn_k": (kv_heads * head_dim, hidden),
        "attn_v": (kv_heads * head_dim, hidden),
        "attn_output": (hidden, heads * head_dim),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }

    def add(name: str, qtype: Q, shape: tuple[int, int], amax: float) -> None:
        writer.add_tensor(name, k_quant_blocks(rng, qtype, shape, amax), raw_dtype=qtype)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    add("token_embd.weight", Q.Q4_K, (vocab, hidden), 1.0)
    for layer, types in enumerate(K_MIX_LAYERS):
        norm(f"blk.{layer}.attn_norm.weight")
        norm(f"blk.{layer}.ffn_norm.weight")
        for stem, qtype in types.items():
            add(f"blk.{layer}.{stem}.weight", qtype, shapes[stem], 0.15)
    norm("output_norm.weight")
    add("output.weight", Q.Q6_K, (vocab, hidden), 0.15)
    finish(writer)


def write(name: str, path: Path) -> None:
    """Write fixture ``name`` (one of `NAMES`) to ``path``."""
    if name == "llama_k_mix":
        write_k_mix(path)
    else:
        write_from_tiny(name, path)


def stale_files(out: Path = OUT) -> list[str]:
    """Fixtures in ``out`` that differ from what `write` makes now (or are missing)."""
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            fresh = Path(tmp) / f"{name}.gguf"
            write(name, fresh)
            committed = out / f"{name}.gguf"
            if not committed.is_file() or committed.read_bytes() != fresh.read_bytes():
                stale.append(str(committed))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 unless the committed files match")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        print("\n".join(stale) or "up to date")
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        write(name, args.out / f"{name}.gguf")
        print(args.out / f"{name}.gguf", (args.out / f"{name}.gguf").stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
