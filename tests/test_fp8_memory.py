"""Resident memory of an FP8 checkpoint: its weights take about the file's size (1 byte per weight plus the
scales) on the NumPy backend, not a float copy (bfloat16 would be twice, the backend's float32 four times).

The checkpoint is a llama-shaped model of about 50 MB of FP8 linear weights in 128 x 128 blocks (random
elements: the numbers do not matter here), made in a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from atlas_core.testing.quantized import quantized_weights
from tests.resident_memory import assert_grows_by_about_the_file_size

pytest.importorskip("atlas_model_llama", reason="the llama family (atlas-model-llama) builds the model")

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, HEADS = 1024, 2816, 4, 512, 8
BLOCK = 128


def fp8_llama(folder: Path, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE, layers: int = LAYERS) -> Path:
    """A llama checkpoint with every linear weight in FP8 (``weight_scale_inv``), embeddings in bfloat16."""
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {}

    def quantized(name: str, rows: int, cols: int) -> None:
        data = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        data[(data & 0x7F) == 0x7F] = 0  # no NaN codes
        tensors[name] = data.view(ml_dtypes.float8_e4m3fn)
        grid = (-(-rows // BLOCK), -(-cols // BLOCK))
        tensors[name + "_scale_inv"] = rng.uniform(1e-4, 2e-4, grid).astype(np.float32)

    def plain(name: str, *shape: int) -> None:
        tensors[name] = (rng.standard_normal(shape) * 0.02 + (1.0 if len(shape) == 1 else 0.0)).astype(
            ml_dtypes.bfloat16
        )

    plain("model.embed_tokens.weight", VOCAB, hidden)
    plain("lm_head.weight", VOCAB, hidden)
    plain("model.norm.weight", hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            quantized(f"{p}self_attn.{proj}.weight", hidden, hidden)
        quantized(p + "mlp.gate_proj.weight", intermediate, hidden)
        quantized(p + "mlp.up_proj.weight", intermediate, hidden)
        quantized(p + "mlp.down_proj.weight", hidden, intermediate)
        plain(p + "input_layernorm.weight", hidden)
        plain(p + "post_attention_layernorm.weight", hidden)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fp8_llama(tmp_path_factory.mktemp("fp8") / "llama_fp8")


def quantized_bytes_in_file(folder: Path) -> int:
    """Bytes of the FP8 elements and their float32 scales in the checkpoint."""
    from atlas_core.weights.safetensors_source import SafetensorsSource

    source = SafetensorsSource(folder)
    return sum(weight.nbytes for name in source.names() if (weight := source.get_quantized(name)) is not None)


def test_quantized_weights_are_held_at_their_file_size(checkpoint: Path) -> None:
    from atlas_core import LLM

    llm = LLM(checkpoint, kv_cache_memory_gib=1 / 256, max_seq_len=64)
    held = quantized_weights(llm.loaded.model)
    assert len(held) == 4 * LAYERS  # per layer: fused Q/K/V, o_proj, fused gate/up, down_proj
    assert sum(w.nbytes for w in held) == quantized_bytes_in_file(checkpoint)


def test_loading_and_running_grows_the_process_by_about_the_file_size(checkpoint: Path, tmp_path: Path) -> None:
    """The weights are copied into memory (the file is not kept mapped), quantized."""
    small = fp8_llama(tmp_path / "small", hidden=128, intermediate=256, layers=1)
    file_bytes = (checkpoint / "model.safetensors").stat().st_size
    assert_grows_by_about_the_file_size(checkpoint, small, file_bytes, "FP8 checkpoint")
