"""Reading a GGUF file's header: its metadata and tensor table, without `gguf.GGUFReader`.

`gguf.GGUFReader` builds numpy views for every string of the file's metadata; for a
49k-token vocabulary with its merges that takes seconds. `open_gguf` parses the same header
with `struct` and `numpy.frombuffer` (a few hundredths of a second), maps the file read-only
and records where each tensor's bytes lie. It follows the format as `GGUFReader` reads it:
versions 2 and 3, either byte order (the header's; tensor bytes are returned as stored),
``general.alignment``, and the same refusals (bad magic, unknown value or tensor types,
duplicate keys or tensor names, rows that are not whole quantization blocks, data running past
the end of the file).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from atlas_core.errors import ModelLoadError

_SUPPORTED_VERSIONS = (2, 3)
_NUMBERS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "u1",
    GGUFValueType.INT8: "i1",
    GGUFValueType.UINT16: "u2",
    GGUFValueType.INT16: "i2",
    GGUFValueType.UINT32: "u4",
    GGUFValueType.INT32: "i4",
    GGUFValueType.FLOAT32: "f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "u8",
    GGUFValueType.INT64: "i8",
    GGUFValueType.FLOAT64: "f8",
}
"""Numeric GGUF value types -> numpy type codes (the byte order is prefixed per file)."""

Buffer = bytes | bytearray | memoryview | np.ndarray
"""What `parse_gguf_header` reads: any contiguous bytes (a numpy array must be 1-D uint8)."""


class GGUFField(NamedTuple):
    """One metadata value: `type` is its GGUF type (``ARRAY`` for lists) and `value` a plain
    Python ``int``/``float``/``bool``/``str`` or a list of them (nested for arrays of arrays)."""

    type: GGUFValueType
    value: Any


class GGUFTensorInfo(NamedTuple):
    """Where one tensor lies: `shape` in numpy order (GGUF lists dims innermost first), `offset`
    the absolute file offset of its `n_bytes` bytes."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """A parsed header: metadata `fields` and `tensors` by GGUF name, both in file order."""

    version: int
    fields: dict[str, GGUFField]
    tensors: dict[str, GGUFTensorInfo]


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file mapped read-only, with its parsed header; `data` is the whole file as uint8."""

    path: Path
    header: GGUFHeader
    data: np.ndarray

    def tensor_bytes(self, info: GGUFTensorInfo) -> np.ndarray:
        """The stored bytes of one tensor: a read-only 1-D uint8 view of the mapped file."""
        return self.data[info.offset : info.offset + info.n_bytes]


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Map and parse a GGUF file; raise `ModelLoadError` naming it if missing, not GGUF, or truncated."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)  # plain views slice faster
        header = parse_gguf_header(data)
    except (ValueError, OSError) as exc:  # ValueError also for an empty file, which cannot be mapped
        raise ModelLoadError(f"{path} is not a readable GGUF file (not GGUF, or truncated): {exc}") from exc
    return GGUFFile(path, header, data)


def parse_gguf_header(buffer: Buffer) -> GGUFHeader:
    """Parse the header of the GGUF file whose bytes are `buffer`.

    Raises `ValueError` if the bytes are not GGUF, use an unsupported version or type, are not
    UTF-8 where text is expected, or end before the header or any tensor's data does.
    """
    return _Parser(buffer).header()


class _Parser:
    """A cursor over a GGUF file's bytes; every read checks it stays inside them."""

    def __init__(self, buffer: Buffer) -> None:
        # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12; arrays are buffers on 3.11 too.
        self.buffer = memoryview(buffer).cast("B")  # type: ignore[arg-type]
        self.pos = 0
        self.order = "<"

    def header(self) -> GGUFHeader:
        if len(self.buffer) < 8 or struct.unpack_from("<I", self.buffer, 0)[0] != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        version = struct.unpack_from("<I", self.buffer, 4)[0]
        if version & 0xFFFF == 0:  # written on a host of the other byte order
            self.order, version = ">", struct.unpack_from(">I", self.buffer, 4)[0]
        if version not in _SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (supported: 2, 3)")
        self.pos = 8
        n_tensors, n_fields = self.unpack("QQ")
        fields: dict[str, GGUFField] = {}
        for _ in range(n_fields):
            key = self.string()
            if key in fields:
                raise ValueError(f"duplicate metadata key {key!r}")
            (raw_type,) = self.unpack("I")
            value_type = GGUFValueType(raw_type)
            fields[key] = GGUFField(value_type, self.value(value_type))
        infos = [self.tensor_info() for _ in range(n_tensors)]
        alignment = GGUF_DEFAULT_ALIGNMENT
        if (field := fields.get("general.alignment")) is not None:
            if field.type != GGUFValueType.UINT32 or field.value == 0 or field.value & (field.value - 1):
                raise ValueError(f"general.alignment must be a non-zero power of two (UINT32), not {field.value!r}")
            alignment = field.value
        data_start = -(-self.pos // alignment) * alignment
        tensors: dict[str, GGUFTensorInfo] = {}
        for name, tensor_type, dims, offset in infos:
            if name in tensors:
                raise ValueError(f"duplicate tensor name {name!r}")
            tensors[name] = _tensor(name, tensor_type, dims, data_start + offset, len(self.buffer))
        return GGUFHeader(version, fields, tensors)

    def take(self, n_bytes: int) -> int:
        """Advance past `n_bytes` bytes; return where they start."""
        start, end = self.pos, self.pos + n_bytes
        if end > len(self.buffer):
            raise ValueError(f"header ends early: {n_bytes} bytes wanted at offset {start}, file is {len(self.buffer)}")
        self.pos = end
        return start

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        layout = struct.Struct(self.order + fmt)
        return layout.unpack_from(self.buffer, self.take(layout.size))

    def string(self) -> str:
        (length,) = self.unpack("Q")
        start = self.take(length)
        return str(self.buffer[start : start + length], "utf-8")

    def value(self, value_type: GGUFValueType) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type == GGUFValueType.ARRAY:
            raw_type, count = self.unpack("IQ")
            return self.array(GGUFValueType(raw_type), count)
        return self.numbers(_NUMBERS[value_type], 1)[0]

    def array(self, item_type: GGUFValueType, count: int) -> list[Any]:
        if count > len(self.buffer) - self.pos:  # every item takes at least one byte
            raise ValueError(f"array of {count} items at offset {self.pos} runs past the end of the file")
        if item_type in _NUMBERS:
            return self.numbers(_NUMBERS[item_type], count)
        if item_type == GGUFValueType.ARRAY:
            return [self.value(item_type) for _ in range(count)]
        buffer, length_of, size = self.buffer, struct.Struct(self.order + "Q").unpack_from, len(self.buffer)
        pos, strings = self.pos, []
        for _ in range(count):  # the vocabulary: kept tight, it runs ~10^5 times
            if pos + 8 > size:
                raise ValueError(f"string array runs past the end of the file at offset {pos}")
            end = pos + 8 + length_of(buffer, pos)[0]
            if end > size:
                raise ValueError(f"string array runs past the end of the file at offset {pos}")
            strings.append(str(buffer[pos + 8 : end], "utf-8"))
            pos = end
        self.pos = pos
        return strings

    def numbers(self, code: str, count: int) -> list[Any]:
        dtype = np.dtype(self.order + code)
        start = self.take(dtype.itemsize * count)
        return np.frombuffer(self.buffer, dtype=dtype, count=count, offset=start).tolist()

    def tensor_info(self) -> tuple[str, int, tuple[int, ...], int]:
        """(name, raw type, GGUF-order dims, offset within the data section) of the next tensor."""
        name = self.string()
        (n_dims,) = self.unpack("I")
        dims = self.unpack(f"{n_dims}Q")
        raw_type, offset = self.unpack("IQ")
        return name, raw_type, dims, offset


def _tensor(name: str, raw_type: int, dims: tuple[int, ...], offset: int, file_size: int) -> GGUFTensorInfo:
    """Validate one tensor-table entry against the file and describe its bytes."""
    tensor_type = GGMLQuantizationType(raw_type)
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    if (dims[0] if dims else 1) % block_size:
        raise ValueError(f"tensor {name!r}: rows of {dims[0] if dims else 1} are not whole {tensor_type.name} blocks")
    n_bytes = math.prod(dims) * type_size // block_size
    if offset + n_bytes > file_size:
        raise ValueError(f"tensor {name!r} ends at byte {offset + n_bytes}, past the end of the file ({file_size})")
    return GGUFTensorInfo(name, tensor_type, tuple(reversed(dims)), offset, n_bytes)
