"""The on-disk form of one record: a 64-byte header, the payload (every array's bytes, back to back), zero
padding to `ALIGN`. The header carries a magic, the caller's key, the payload length, its CRC-32 and the
digest of the tier's identity (model + KV layout), so a read can tell a good record from a corrupt,
truncated, stale or foreign one."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from atlas_core.storage.backend import RecordFormat
from atlas_storage_nvme.direct_io import aligned

HEADER = struct.Struct("<8sqqII32s")  # magic, key, payload bytes, crc32, flags, identity digest
MAGIC = b"ATLASKV1"
HAS_KEY = 1

Mapper = Callable[[Callable[[int], int], Iterable[int]], Iterator[int]]
"""How checksums of a batch's rows are computed: `map`, or a thread pool's ``map`` (``zlib.crc32`` releases
the GIL, so records are checksummed in parallel)."""


class RecordCodec:
    """Packs batches of records into page-aligned slot images and checks them on the way back."""

    def __init__(self, format: RecordFormat, identity: bytes) -> None:
        self.format = format
        self.identity = identity
        self.payload_bytes = format.nbytes
        self.slot_bytes = aligned(HEADER.size + self.payload_bytes)
        self._columns: list[tuple[int, int]] = []  # (start, bytes) of each array inside a slot image
        start = HEADER.size
        for shape, dtype in format.arrays:
            size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self._columns.append((start, size))
            start += size

    def pack(
        self, images: np.ndarray, keys: Sequence[int | None], arrays: Sequence[np.ndarray], mapper: Mapper = map
    ) -> None:
        """Fill ``images`` (``uint8 [n, slot_bytes]``) with records ``i`` of ``arrays`` under ``keys[i]``."""
        count = len(keys)
        for (start, size), values in zip(self._columns, arrays, strict=True):
            images[:count, start : start + size] = (
                np.ascontiguousarray(values[:count]).reshape(count, -1).view(np.uint8)
            )
        for row, (key, crc) in enumerate(
            zip(keys, mapper(lambda row: self._crc(images, row), range(count)), strict=True)
        ):
            flags = HAS_KEY if key is not None else 0
            header = HEADER.pack(MAGIC, key or 0, self.payload_bytes, crc, flags, self.identity)
            images[row, : HEADER.size] = np.frombuffer(header, dtype=np.uint8)

    def unpack(
        self,
        images: np.ndarray,
        expected_keys: Sequence[int | None],
        out: Sequence[np.ndarray],
        mapper: Mapper = map,
    ) -> list[int]:
        """Copy the payloads of ``images`` into rows of ``out``; return the rows that fail a check (wrong magic,
        identity, length, key or checksum), whose ``out`` rows are then undefined."""
        count = len(expected_keys)
        crcs = mapper(lambda row: self._crc(images, row), range(count))
        bad = []
        for row, (key, crc) in enumerate(zip(expected_keys, crcs, strict=True)):
            magic, stored_key, length, stored_crc, flags, identity = HEADER.unpack(images[row, : HEADER.size].tobytes())
            stored = stored_key if flags & HAS_KEY else None
            if (
                magic != MAGIC
                or identity != self.identity
                or length != self.payload_bytes
                or (key is not None and stored != key)
                or crc != stored_crc
            ):
                bad.append(row)
        for (start, size), (shape, dtype), target in zip(self._columns, self.format.arrays, out, strict=True):
            target[:count] = images[:count, start : start + size].view(dtype).reshape(count, *shape)
        return bad

    def _crc(self, images: np.ndarray, row: int) -> int:
        return zlib.crc32(images[row, HEADER.size : HEADER.size + self.payload_bytes].data)
