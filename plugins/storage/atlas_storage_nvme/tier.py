"""`NvmeStorage`: the ``nvme`` KV tier, fixed-size record slots in one preallocated file of ``kv_spill_dir``.

Layout of the directory: ``LOCK`` (`DirectoryLock`), ``blocks.bin`` (slot ``s`` at offset
``s * slot_bytes``, see `RecordCodec`) and, with persistence on, ``index.json`` (which slot holds which key,
written when the tier closes, for the same identity only). Every read verifies the record's header and
checksum: a corrupt or truncated record is reported lost, never returned. Reads and writes are batched
vectored calls through io_uring, or on a thread pool where io_uring is unavailable (`DirectFile`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from atlas_core.storage.backend import StorageBackend, StorageFullError, TierSpec
from atlas_storage_nvme.direct_io import DirectFile, IOChoice
from atlas_storage_nvme.lock import DirectoryLock
from atlas_storage_nvme.records import RecordCodec

log = logging.getLogger("atlas.storage")

DATA_FILE = "blocks.bin"
INDEX_FILE = "index.json"
CHECKSUM_THREADS = min(8, os.cpu_count() or 1)
"""Threads that checksum a batch's records in parallel."""
STAGING_BYTES = 32 * 2**20
"""Host staging rows of a tier (at least two records where it holds two): a batch moves through them in chunks
of half of them, one half packed or unpacked while the other is written or read."""


class NvmeStorage(StorageBackend):
    """Records of ``spec.format`` in ``spec.directory``, at most ``spec.capacity_bytes`` of slots.

    ``io`` picks how transfers run (`IOChoice`; the engine constructs the tier with the default, ``auto``).
    Raises `ConfigError` when another engine holds the directory, `StorageFullError` / `OSError` when the file
    cannot be created or preallocated (the engine then runs without this tier)."""

    def __init__(self, spec: TierSpec, io: IOChoice = "auto") -> None:
        if spec.directory is None:
            raise ValueError("the nvme storage tier needs a directory (kv_spill_dir)")
        directory = Path(spec.directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.codec = RecordCodec(spec.format, hashlib.sha256(spec.identity.encode()).digest())
        self._capacity = spec.capacity_bytes // self.codec.slot_bytes
        self._keys: dict[int, int | None] = {}  # written slots -> their key
        lock = DirectoryLock(directory)
        index = directory / INDEX_FILE
        try:
            persisted = _load_index(index, self.codec, self._capacity) if spec.persist else {}
            index.unlink(missing_ok=True)  # rewritten on close; a crash leaves no stale index
            size = self._capacity * self.codec.slot_bytes
            rows = max(1, min(self._capacity, max(2, STAGING_BYTES // self.codec.slot_bytes)))
            try:
                self.file = DirectFile(directory / DATA_FILE, size, self.codec.slot_bytes, rows, io)
            except OSError as exc:
                raise StorageFullError(
                    f"cannot create {size / 2**30:.2f} GiB of KV slots in {directory}: {exc}"
                ) from exc
        except BaseException:
            lock.release()
            raise
        self._keys.update(persisted)
        self._persisted = dict(persisted)
        self.direct = self.file.direct
        log.info(
            "KV tier %s: %d slots of %d bytes, %s I/O through %s",
            directory,
            self._capacity,
            self.codec.slot_bytes,
            "O_DIRECT" if self.direct else "buffered (the filesystem refuses O_DIRECT)",
            self.file.io.name,
        )
        self._halves = 2 if len(self.file.staging) >= 2 else 1
        self._checksums = ThreadPoolExecutor(CHECKSUM_THREADS, thread_name_prefix="atlas-nvme-crc")
        self._finalizer = weakref.finalize(
            self, _shutdown, self.file, self._checksums, lock, self._keys, index if spec.persist else None, self.codec
        )

    @property
    def capacity_slots(self) -> int:
        return self._capacity

    def persisted(self) -> dict[int, int]:
        return {slot: key for slot, key in self._persisted.items() if key is not None}

    def write(self, slots: Sequence[int], keys: Sequence[int | None], arrays: Sequence[np.ndarray]) -> None:
        size, pending = self.codec.slot_bytes, deque[Callable[[], None]]()
        try:
            for start, rows in self._chunks(len(slots)):
                if len(pending) == self._halves:
                    pending.popleft()()  # the rows of this half are free again
                chunk = slots[start : start + len(rows)]
                images = self.file.staging[rows.start : rows.stop]
                self.codec.pack(
                    images, keys[start : start + len(rows)], [a[start:] for a in arrays], self._checksums.map
                )
                pending.append(
                    self.file.start_write([(slot * size, row) for row, slot in zip(rows, chunk, strict=True)])
                )
            while pending:
                pending.popleft()()
        except OSError as exc:
            _drain(pending)
            for slot in slots:
                self._keys.pop(slot, None)
            raise StorageFullError(str(exc)) from exc
        self._keys.update(zip(slots, keys, strict=True))

    def read(self, slots: Sequence[int], out: Sequence[np.ndarray]) -> list[int]:
        size, pending = self.codec.slot_bytes, deque[tuple[int, range, Callable[[], None]]]()
        lost = [slot for slot in slots if slot not in self._keys]
        try:
            for start, rows in self._chunks(len(slots)):
                if len(pending) == self._halves:
                    lost += self._unpack(slots, out, *pending.popleft())
                chunk = zip(rows, slots[start : start + len(rows)], strict=True)
                pending.append(
                    (start, rows, self.file.start_read([(s * size, r) for r, s in chunk if s in self._keys]))
                )
            while pending:
                lost += self._unpack(slots, out, *pending.popleft())
        finally:
            _drain(wait for *_, wait in pending)
        for slot in lost:
            self._keys.pop(slot, None)
        return lost

    def _chunks(self, count: int) -> Iterator[tuple[int, range]]:
        """``(first record, staging rows)`` of each chunk of a ``count``-record batch, alternating between the
        staging halves so that one half is packed or unpacked while the other is on its way."""
        half = len(self.file.staging) // self._halves
        for number, start in enumerate(range(0, count, half)):
            base = (number % self._halves) * half
            yield start, range(base, base + min(half, count - start))

    def _unpack(
        self, slots: Sequence[int], out: Sequence[np.ndarray], start: int, rows: range, wait: Callable[[], None]
    ) -> list[int]:
        """Wait for a chunk's reads and copy its records into ``out``; the slots that fail their checks."""
        wait()
        chunk = slots[start : start + len(rows)]
        images = self.file.staging[rows.start : rows.stop]
        targets = [target[start:] for target in out]
        bad = self.codec.unpack(images, [self._keys.get(slot) for slot in chunk], targets, self._checksums.map)
        return [chunk[row] for row in bad if chunk[row] in self._keys]

    def discard(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self._keys.pop(slot, None)
            self._persisted.pop(slot, None)

    def close(self) -> None:
        self._finalizer()


def _drain(waits: Iterable[Callable[[], None]]) -> None:
    """Wait for transfers still in flight after a failure (their staging rows are reused next), ignoring theirs."""
    for wait in waits:
        try:
            wait()
        except OSError:
            pass


def _load_index(path: Path, codec: RecordCodec, capacity: int) -> dict[int, int | None]:
    """The slots a previous run of the same identity and layout left, by key (empty when none or another's)."""
    try:
        index = json.loads(path.read_text())
        if index["identity"] != codec.identity.hex() or index["slot_bytes"] != codec.slot_bytes:
            return {}
        return {int(slot): int(key) for slot, key in index["slots"].items() if int(slot) < capacity}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _save_index(path: Path, codec: RecordCodec, keys: dict[int, int | None]) -> None:
    index = {
        "identity": codec.identity.hex(),
        "slot_bytes": codec.slot_bytes,
        "slots": {str(slot): key for slot, key in keys.items() if key is not None},
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(index))
    os.replace(temporary, path)


def _shutdown(
    file: DirectFile,
    checksums: ThreadPoolExecutor,
    lock: DirectoryLock,
    keys: dict[int, int | None],
    index: Path | None,
    codec: RecordCodec,
) -> None:
    """Close the data file and the threads, write the ``index`` (None: persistence off), then release the
    directory."""
    try:
        checksums.shutdown(wait=True)
        file.close()
        if index is not None:
            _save_index(index, codec, keys)
    finally:
        lock.release()
