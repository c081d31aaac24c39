"""Hugging Face folders of safetensors files (single or sharded), memory-mapped.

The ``safetensors`` package's NumPy API cannot return bfloat16 tensors, so tensors are mapped
directly from the documented file layout (8-byte little-endian header size, JSON header of
``{name: {dtype, shape, data_offsets}}``, then the data) with ``numpy.memmap``; bf16 is viewed
as ``ml_dtypes.bfloat16``. Nothing is read until a tensor is asked for.

`get_part` reads one rank's part of a tensor (tensor parallelism) without reading the rest of it, as
``safetensors``' ``get_slice`` does.

FP8 checkpoints (`atlas_core.weights.quant_config`): `get_quantized` returns a quantized linear
weight as a `QuantizedWeight` (its F8_E4M3 elements viewed from the file, its scale as float32), and
`get` returns its dequantized float32 values, so loaders that rearrange a weight arithmetically
still read correct numbers. NVFP4 checkpoints the same way: compressed-tensors' ``X.weight_packed`` is listed
and read as ``X.weight`` (with ``X.weight_scale`` and ``X.weight_global_scale``), ModelOpt's packed
``X.weight`` as itself (with ``X.weight_scale`` and ``X.weight_scale_2``); a ModelOpt checkpoint whose
config.json has no ``quantization_config`` is recognised by its ``hf_quant_config.json``.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from atlas_core.errors import ModelLoadError
from atlas_core.weights.nvfp4 import NVFP4
from atlas_core.weights.quant_config import QuantizationScheme
from atlas_core.weights.quantized import QuantizedWeight, dequantize

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
MAX_HEADER_BYTES = 100 * 2**20

log = logging.getLogger("atlas.weights")


def _read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """``(data_start, header)`` of one safetensors file, validated against the file size."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ModelLoadError(f"{path}: not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise ModelLoadError(
                f"{path}: corrupt safetensors header (claims {header_len} header bytes in a {size}-byte file)"
            )
        try:
            header = json.loads(handle.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{path}: corrupt safetensors header ({exc})") from exc
    data_start = 8 + header_len
    header.pop("__metadata__", None)
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if data_start + end > size:
            raise ModelLoadError(
                f"{path}: tensor {name!r} ends at byte {data_start + end} "
                f"but the file has {size} bytes (truncated download?)"
            )
        if info["dtype"] not in DTYPES:
            raise ModelLoadError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which is not supported")
        expected = int(np.prod(info["shape"], dtype=np.int64)) * DTYPES[info["dtype"]].itemsize
        if end - begin != expected:
            raise ModelLoadError(
                f"{path}: tensor {name!r} has {end - begin} bytes, its shape {info['shape']} needs {expected}"
            )
    return data_start, header


class SafetensorsSource:
    """A `WeightSource` over a folder's ``config.json`` and safetensors weights."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.config = _read_config(self.folder / "config.json")
        self.quantization = QuantizationScheme.from_config(self.config, str(self.folder / "config.json"))
        """The checkpoint's quantization (None: its weights are plain floats)."""
        hf_quant = self.folder / "hf_quant_config.json"
        if self.quantization is None and hf_quant.exists():
            self.quantization = QuantizationScheme.from_hf_quant_config(_read_config(hf_quant), str(hf_quant))
        self._index: dict[str, tuple[Path, int, dict[str, Any]]] = {}
        for path in self._weight_files():
            data_start, header = _read_header(path)
            for name, info in header.items():
                self._index[name] = (path, data_start, info)
        self._read_headless_base_model()
        self._aliases: dict[str, str] = {}
        """Names read in place of stored ones (compressed-tensors NVFP4: ``X.weight`` -> ``X.weight_packed``)."""
        if self.quantization is not None and self.quantization.format == NVFP4:
            for name in self._index:
                logical = name.removesuffix("_packed")
                if logical != name and self.quantization.nvfp4_names(logical)[0] == name:
                    self._aliases[logical] = name
        self._maps: dict[Path, np.memmap] = {}

    def _read_headless_base_model(self) -> None:
        """A base model saved without its causal-LM wrapper (``Qwen3Model``, ``LlamaModel``: how embedding
        checkpoints such as Qwen3-Embedding ship) stores ``embed_tokens.weight``, ``layers.*`` and ``norm.weight``
        with no ``model.`` prefix and no ``lm_head.weight``: its tensors are read under the causal LM's names, and
        where the config does not tie the LM head it reads the embedding matrix (the engine samples one token
        after an embedding request; the embeddings themselves never use the head)."""
        if "embed_tokens.weight" not in self._index or any(name.startswith("model.") for name in self._index):
            return
        self._index = {f"model.{name}": entry for name, entry in self._index.items()}
        if "lm_head.weight" not in self._index and not self.config.get("tie_word_embeddings", False):
            self._index["lm_head.weight"] = self._index["model.embed_tokens.weight"]
            log.info("%s: a base model without an LM head; its embedding matrix serves as one", self.folder)

    def _weight_files(self) -> list[Path]:
        index_path = self.folder / "model.safetensors.index.json"
        if index_path.exists():
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ModelLoadError(f"{index_path}: not a valid safetensors index ({exc})") from exc
            files = [self.folder / name for name in sorted(set(weight_map.values()))]
            missing = [str(path) for path in files if not path.exists()]
            if missing:
                raise ModelLoadError(f"{index_path} lists shards that are missing: {', '.join(missing)}")
            return files
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(
                f"{self.folder}: no weights found (expected model.safetensors or model.safetensors.index.json); "
                "PyTorch .bin checkpoints are not supported, convert them to safetensors"
            )
        return files

    def names(self) -> Iterator[str]:
        return iter([*self._index, *self._aliases])

    def __contains__(self, name: str) -> bool:
        return name in self._index or name in self._aliases

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` as stored (a read-only view of the file), or dequantized to float32 when it is a
        quantized weight (`get_quantized`)."""
        quantized = self.get_quantized(name)
        return self._raw(name) if quantized is None else dequantize(quantized)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape as stored, from the file header (nothing is read)."""
        if name not in self._index:
            raise ModelLoadError(f"{self.folder}: weight {name!r} is not in the checkpoint")
        return tuple(self._index[name][2]["shape"])

    def get_part(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The part ``index`` (one slice per leading axis) of float tensor ``name``, copied out of the file:
        only the bytes of that part are read, so a rank of a split model never reads whole tensors."""
        return np.ascontiguousarray(self._raw(name)[index])

    def get_quantized(self, name: str) -> QuantizedWeight | None:
        """Tensor ``name`` as a host `QuantizedWeight` when it is stored quantized (F8_E4M3 with its scale
        tensor), else None. A float8 tensor without a scale, or in a checkpoint whose config.json declares
        no quantization, raises `ModelLoadError`. NVFP4 checkpoints: `_nvfp4`."""
        if self.quantization is not None and self.quantization.format == NVFP4:
            return self._nvfp4(name)
        if name not in self._index or self._index[name][2]["dtype"] != "F8_E4M3":
            return None
        scheme = self.quantization
        if scheme is None:
            raise ModelLoadError(
                f"{self.folder}: tensor {name!r} is stored as F8_E4M3 but config.json has no quantization_config"
            )
        scale_name = next((n for n in scheme.scale_names(name) if n in self._index), None)
        if scale_name is None:
            raise ModelLoadError(
                f"{self.folder}: tensor {name!r} is stored as F8_E4M3 but its scale "
                f"({' or '.join(repr(n) for n in scheme.scale_names(name))}) is not in the checkpoint"
            )
        return scheme.weight(name, self._raw(name), self._raw(scale_name))

    def _nvfp4(self, name: str) -> QuantizedWeight | None:
        """NVFP4 weight ``name`` when its packed elements are stored (U8) with their scales, else None."""
        assert self.quantization is not None
        packed, scale, global_scale = self.quantization.nvfp4_names(name)
        if packed not in self._index or self._index[packed][2]["dtype"] != "U8":
            return None
        missing = [n for n in (scale, global_scale) if n not in self._index]
        if missing:
            raise ModelLoadError(
                f"{self.folder}: NVFP4 tensor {packed!r} is stored without {' and '.join(map(repr, missing))}"
            )
        if self._index[scale][2]["dtype"] != "F8_E4M3":
            raise ModelLoadError(
                f"{self.folder}: NVFP4 group scale {scale!r} is stored as {self._index[scale][2]['dtype']}; "
                "expected F8_E4M3"
            )
        return self.quantization.nvfp4_weight(name, self._raw(packed), self._raw(scale), self._raw(global_scale))

    def _raw(self, name: str) -> np.ndarray:
        if name not in self._index:
            raise ModelLoadError(f"{self.folder}: weight {name!r} is not in the checkpoint")
        path, data_start, info = self._index[name]
        if path not in self._maps:
            self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        raw = self._maps[path][data_start + begin : data_start + end]
        return raw.view(DTYPES[info["dtype"]]).reshape(info["shape"])


def _read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ModelLoadError(
            f"{path.parent}: config.json is missing; a model folder needs config.json and safetensors weights"
        )
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return config
