"""Resident memory of a Q4_K GGUF model: its quantized weights take the file's tensor bytes on the NumPy
backend (4.5 bits a weight), not a float32 copy (about 7 times more).

The file is a llama-shaped model of about 28 MiB of Q4_K linear weights (random blocks with sensible
scales, as ``scripts/make_gguf_fixtures.py`` makes them: the numbers do not matter here), made in a
temporary folder; the embedding and LM head are F16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from atlas_core.testing.quantized import quantized_weights
from atlas_core.weights.gguf import GGUFSource
from tests.resident_memory import assert_grows_by_about_the_file_size
from tests.test_gguf_quantized import generator

pytest.importorskip("atlas_model_llama", reason="the llama family (atlas-model-llama) builds the model")

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, HEADS = 1024, 2816, 4, 512, 8


def q4_k_llama(path: Path, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE, layers: int = LAYERS) -> Path:
    """A llama GGUF file with every linear weight in Q4_K, the embedding and LM head in F16."""
    script = generator()
    rng = np.random.default_rng(0)
    config = {"layers": layers, "hidden": hidden, "ffn": intermediate, "heads": HEADS, "kv_heads": HEADS}
    config |= {"head_dim": hidden // HEADS, "eps": 1e-6, "theta": 10000.0, "vocab": VOCAB}
    writer = script.gguf_writer(path, "llama", config)

    def quantized(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, script.k_quant_blocks(rng, Q.Q4_K, (rows, cols), 0.05), raw_dtype=Q.Q4_K)

    writer.add_tensor("token_embd.weight", (rng.standard_normal((VOCAB, hidden)) * 0.02).astype(np.float16))
    writer.add_tensor("output.weight", (rng.standard_normal((VOCAB, hidden)) * 0.02).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        for stem in ("attn_q", "attn_k", "attn_v", "attn_output"):
            quantized(f"blk.{i}.{stem}.weight", hidden, hidden)
        quantized(f"blk.{i}.ffn_gate.weight", intermediate, hidden)
        quantized(f"blk.{i}.ffn_up.weight", intermediate, hidden)
        quantized(f"blk.{i}.ffn_down.weight", hidden, intermediate)
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
    script.finish(writer)
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return q4_k_llama(tmp_path_factory.mktemp("gguf") / "llama_q4_k.gguf")


def quantized_bytes_in_file(path: Path) -> int:
    """Bytes of the file's tensors that `GGUFSource.get_quantized` keeps as blocks."""
    source = GGUFSource(path)
    return sum(weight.nbytes for name in source.names() if (weight := source.get_quantized(name)) is not None)


def test_quantized_weights_are_held_at_their_file_size(model_file: Path) -> None:
    from atlas_core import LLM

    llm = LLM(model_file, kv_cache_memory_gib=1 / 256, max_seq_len=64, gguf_weights="quantized")
    held = quantized_weights(llm.loaded.model)
    assert len(held) == 4 * LAYERS  # per layer: fused Q/K/V, o_proj, fused gate/up, down_proj
    assert {w.format for w in held} == {"gguf_q4_k"}
    assert sum(w.nbytes for w in held) == quantized_bytes_in_file(model_file)
    elements = sum(int(np.prod(w.shape)) for w in held)
    assert sum(w.nbytes for w in held) * 8 == elements * 4.5  # 144 bytes per 256 weights


def test_loading_and_running_grows_the_process_by_about_the_file_size(model_file: Path, tmp_path: Path) -> None:
    """The blocks are copied into memory (the file is not kept mapped), quantized."""
    small = q4_k_llama(tmp_path / "small.gguf", hidden=256, intermediate=256, layers=1)
    assert_grows_by_about_the_file_size(model_file, small, model_file.stat().st_size, "Q4_K file")
