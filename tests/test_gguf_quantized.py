"""GGUF block-quantized weights kept as their blocks (`atlas_core.weights.gguf_quantized`).

The committed tiny files (``tests/fixtures/gguf``, made by ``scripts/make_gguf_fixtures.py``) cover Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, a Q4_K / Q5_K / Q6_K mix and a Q8_0 mixture-of-experts file (``qwen3moe``); each must
give the logits (and greedy tokens) of the same file read as floats at load, while keeping its quantized linear
weights (and expert banks) as blocks in memory."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.backends.ops.moe import expert_matrix
from atlas_core.weights.gguf import GGUFSource
from atlas_core.weights.gguf_quantized import FORMATS, dequantize_bytes, gguf_weight, quantize
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight, concat_rows, dequantize, stack_experts, take_rows
from tests.scripts_loader import load_script

pytest.importorskip("atlas_model_llama", reason="the llama family (atlas-model-llama) builds the models")
pytest.importorskip("atlas_model_qwen3", reason="the qwen3 family (atlas-model-qwen3) builds qwen3_q5_1")

REPOSITORY = Path(__file__).resolve().parent.parent
FIXTURES = REPOSITORY / "tests" / "fixtures" / "gguf"
MAX_FIXTURE_BYTES = 640 * 1024
HELD = {
    "llama_q8_0": (13, {"gguf_q8_0"}),
    "llama_q4_0": (13, {"gguf_q4_0"}),
    "qwen2_q4_1": (9, {"gguf_q4_1"}),
    "qwen2_q5_0": (9, {"gguf_q5_0"}),
    "qwen3_q5_1": (9, {"gguf_q5_1"}),
    # a dense layer (QKV, o_proj, gate/up, down) and two MoE layers (QKV, o_proj, router, gate/up and down banks)
    "qwen3moe_q8_0": (15, {"gguf_q8_0"}),
    # layer 1 fuses Q4_K Q/K with a Q6_K V: that fused weight is dequantized at load
    "llama_k_mix": (8, {"gguf_q4_k", "gguf_q5_k", "gguf_q6_k"}),
}
"""Fixture -> (quantized weights held: per layer fused Q/K/V, o_proj, fused gate/up, down_proj, plus an
untied LM head; their formats)."""


def generator() -> ModuleType:
    return load_script("make_gguf_fixtures")


def test_fixtures_are_what_the_generator_makes_and_small() -> None:
    assert generator().stale_files() == [], "run: uv run python scripts/make_gguf_fixtures.py"
    for name in HELD:
        assert (FIXTURES / f"{name}.gguf").stat().st_size <= MAX_FIXTURE_BYTES, name


@pytest.mark.parametrize("name", sorted(HELD))
def test_logits_equal_the_file_read_as_floats(name: str) -> None:
    from atlas_core import LLM, SamplingParams
    from atlas_core.testing.quantized import LOGIT_TOLERANCE, prompt_logits, quantized_weights, sample_prompts

    if name.startswith("qwen3moe"):
        pytest.importorskip("atlas_model_qwen3_moe", reason="the qwen3-moe family builds qwen3moe_q8_0")
    path = FIXTURES / f"{name}.gguf"
    quantized = LLM(path, kv_cache_memory_gib=1 / 64, gguf_weights="quantized")
    reference = LLM(path, kv_cache_memory_gib=1 / 64, gguf_weights="float")
    held = quantized_weights(quantized.loaded.model)
    assert (len(held), {w.format for w in held}) == HELD[name]
    assert not quantized_weights(reference.loaded.model)
    assert all(np.asarray(w.data).dtype == np.uint8 and w.scales is None for w in held)
    prompts = sample_prompts(256)
    for prompt in prompts:
        got, want = prompt_logits(quantized, prompt), prompt_logits(reference, prompt)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_TOLERANCE, err_msg=f"{name}, {prompt}")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    got_tokens = [o.outputs[0].token_ids for o in quantized.generate(prompts, params)]
    assert got_tokens == [o.outputs[0].token_ids for o in reference.generate(prompts, params)]


def test_a_moe_file_gives_its_checkpoints_logits_and_keeps_expert_banks(tmp_path: Path) -> None:
    """A ``qwen3moe`` GGUF written from the tiny Qwen3-MoE checkpoint in F32 (as llama.cpp's converter lays it
    out: expert banks, router ``ffn_gate_inp``) gives the checkpoint's logits; its config has the expert counts
    and the dense layer; the Q8_0 fixture's banks come as stored, gate and up fused."""
    pytest.importorskip("atlas_model_qwen3_moe", reason="the qwen3-moe family builds the models")
    from atlas_core import LLM
    from atlas_core.testing.quantized import prompt_logits, sample_prompts

    folder = generator().TINY["qwen3_moe"]
    path = tmp_path / "qwen3moe_f32.gguf"
    generator().write_checkpoint(folder, path, None)
    source = GGUFSource(path)
    hf_config = json.loads((folder / "config.json").read_text())
    assert source.config["num_experts"] == hf_config["num_local_experts"]
    for key in ("num_experts_per_tok", "moe_intermediate_size", "mlp_only_layers", "norm_topk_prob"):
        assert source.config[key] == hf_config[key], key
    from_gguf, from_checkpoint = LLM(path, kv_cache_memory_gib=1 / 64), LLM(folder, kv_cache_memory_gib=1 / 64)
    for prompt in sample_prompts(256)[:3]:
        np.testing.assert_allclose(prompt_logits(from_gguf, prompt), prompt_logits(from_checkpoint, prompt), atol=1e-5)

    fixture = GGUFSource(FIXTURES / "qwen3moe_q8_0.gguf")
    layer = f"model.layers.{hf_config['num_hidden_layers'] - 1}.mlp."
    gate_up = fixture.get_quantized(layer + "experts.gate_up_proj")
    assert isinstance(gate_up, QuantizedWeight) and gate_up.format == "gguf_q8_0"
    experts, inner = hf_config["num_local_experts"], hf_config["moe_intermediate_size"]
    assert gate_up.shape == (experts, 2 * inner, hf_config["hidden_size"])
    np.testing.assert_array_equal(dequantize(gate_up), fixture.get(layer + "experts.gate_up_proj"))
    np.testing.assert_array_equal(
        fixture.get(layer + "experts.gate_up_proj")[:, inner:], fixture.get(layer + "experts.up_proj")
    )


def test_source_offers_blocks_with_qk_rows_in_hf_order() -> None:
    source = GGUFSource(FIXTURES / "llama_q4_0.gguf")
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        weight = source.get_quantized(name)
        assert isinstance(weight, QuantizedWeight) and weight.format == "gguf_q4_0"
        np.testing.assert_array_equal(dequantize(weight), source.get(name))  # get undoes the interleave on values
    assert source.get_quantized("model.norm.weight") is None  # F32
    assert source.get_quantized("model.embed_tokens.weight") is not None  # loaders read embeddings with `get`


def test_packed_weights_validate_and_move_whole_rows() -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((6, 64)).astype(np.float32)
    weight = quantize(values, Q.Q8_0)
    assert weight.block == (1, 32) and weight.data.shape == (6, 68) and weight.nbytes == 6 * 68
    with pytest.raises(ValueError, match="needs data of shape"):
        QuantizedWeight("gguf_q8_0", weight.data[:, :34], None, (1, 32), (6, 64))
    with pytest.raises(ValueError, match="whole blocks"):
        gguf_weight(np.zeros(34, np.uint8), Q.Q8_0, (1, 48))
    with pytest.raises(ValueError, match="no scales"):
        QuantizedWeight("gguf_q8_0", weight.data, np.ones((6, 2), np.float32), (1, 32), (6, 64))
    full = dequantize(weight)
    other = quantize(values[:2], Q.Q8_0)
    fused = concat_rows([weight, other])
    assert isinstance(fused, QuantizedWeight)
    np.testing.assert_array_equal(dequantize(fused), np.concatenate([full, full[:2]]))
    mixed = concat_rows([weight, quantize(values[:2], Q.Q4_0)])  # two formats: dequantized
    assert isinstance(mixed, np.ndarray) and mixed.shape == (8, 64)
    order = np.array([5, 0, 3, 1, 4, 2])
    np.testing.assert_array_equal(dequantize(take_rows(weight, order)), full[order])
    bank = stack_experts([weight, quantize(values[::-1].copy(), Q.Q8_0)])
    assert isinstance(bank, QuantizedWeight) and bank.shape == (2, 6, 64)
    np.testing.assert_array_equal(expert_matrix(bank, 1), dequantize(quantize(values[::-1].copy(), Q.Q8_0)))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q6_K])
def test_numpy_linear_dequantizes_in_row_chunks(qtype: Q, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    if qtype == Q.Q6_K:
        weight = gguf_weight(generator().k_quant_blocks(rng, qtype, (40, 512), 0.2), qtype, (40, 512))
    else:
        weight = quantize(rng.standard_normal((40, 512)).astype(np.float32), qtype)
    backend = NumpyBackend()
    uploaded = backend.upload_quantized(weight)
    assert isinstance(uploaded, QuantizedWeight) and uploaded.nbytes == weight.nbytes
    x = rng.standard_normal((3, 512)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    want = x @ dequantize(weight).T + bias
    monkeypatch.setattr("atlas_core.backends.numpy_backend.DEQUANTIZE_ELEMENTS", 512 * 7)  # 7 rows at a time
    np.testing.assert_allclose(backend.linear(x, uploaded, bias), want, rtol=1e-6, atol=1e-5)


def test_a_backend_without_the_format_dequantizes_it_at_load() -> None:
    class Fp8Only(NumpyBackend):
        quantized_formats = frozenset({FP8_E4M3})

    weight = quantize(np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32), Q.Q5_0)
    uploaded = Fp8Only().upload_quantized(weight)
    assert isinstance(uploaded, np.ndarray)
    np.testing.assert_array_equal(uploaded, dequantize(weight))


def test_formats_decode_with_the_gguf_package() -> None:
    assert set(FORMATS) == {Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K}
    values = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.quants import quantize as gguf_quantize

    raw = gguf_quantize(values, Q.Q8_0)
    np.testing.assert_array_equal(dequantize_bytes(raw, Q.Q8_0, (2, 256)), gguf_dequantize(raw, Q.Q8_0))


def test_auto_keeps_the_blocks_only_when_the_float_copy_would_crowd_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gguf_weights="auto"``: a small model's blocks become floats (faster on the NumPy backend); the same
    model where its float copy would take more than half of the free memory stays in its blocks."""
    import atlas_core.model.load as load
    from atlas_core import LLM
    from atlas_core.testing.quantized import quantized_weights

    path = FIXTURES / "llama_q4_0.gguf"
    assert not quantized_weights(LLM(path, kv_cache_memory_gib=1 / 64).loaded.model)
    float_bytes = GGUFSource(path).quantized_elements() * 4
    monkeypatch.setattr(load, "available_memory", lambda backend: (float_bytes, "available host memory"))
    assert quantized_weights(LLM(path, kv_cache_memory_gib=1 / 64).loaded.model)
