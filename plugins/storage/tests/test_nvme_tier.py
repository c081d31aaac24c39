"""atlas-storage-nvme: the ``nvme`` tier stores records bit-exact through io_uring and the thread pool, with
O_DIRECT where the filesystem allows it; a corrupt, truncated, stale or foreign record is reported lost, never
returned; a full disk or an unwritable path is a `StorageFullError` / `OSError` the engine degrades on; one
engine per directory; records persist across restarts only when asked, for the same identity; a liburing binding
whose code dies on this processor is tried in a child process and leaves the thread pool in charge."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from atlas_storage_nvme import tier as tier_module
from atlas_storage_nvme import uring as uring_module
from atlas_storage_nvme.direct_io import IOChoice, open_io
from atlas_storage_nvme.records import HEADER
from atlas_storage_nvme.tier import DATA_FILE, INDEX_FILE, NvmeStorage
from atlas_storage_nvme.uring import UringIO, describe_failure

from atlas_core.errors import ConfigError
from atlas_core.plugins import load_plugins
from atlas_core.storage import RecordFormat, StorageFullError, TierSpec
from atlas_core.testing.storage import random_records

FORMAT = RecordFormat(
    (((3, 2, 40), np.dtype(np.float32)), ((4, 3), np.dtype(ml_dtypes.bfloat16)), ((9,), np.dtype(np.int64)))
)
SLOTS = 12


def uring_problem() -> str | None:
    """Why io_uring cannot run here, or None."""
    try:
        UringIO.open(os.open(os.devnull, os.O_RDONLY), []).close()
    except (ImportError, OSError) as exc:
        return describe_failure(exc)
    return None


IO_CHOICES = [
    pytest.param("io_uring", marks=pytest.mark.skipif(uring_problem() is not None, reason=f"{uring_problem()}")),
    "threads",
]


def records(count: int, seed: int = 0) -> list[np.ndarray]:
    return random_records(FORMAT, count, seed)


def bits(arrays: list[np.ndarray]) -> list[bytes]:
    return [a.tobytes() for a in arrays]


def open_tier(directory: Path, io: IOChoice = "auto", identity: str = "model-a", persist: bool = False) -> NvmeStorage:
    return NvmeStorage(TierSpec(FORMAT, SLOTS * 4096, directory, identity, persist), io=io)


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[NvmeStorage]:
    storage = open_tier(tmp_path / "spill")
    yield storage
    storage.close()


def test_registered_through_the_storage_hook() -> None:
    registration = load_plugins().find("storage", "nvme")
    assert registration is not None and registration.plugin.distribution == "atlas-storage-nvme"
    assert registration.load() is NvmeStorage


@pytest.mark.parametrize("staging_rows", [3, 4])
@pytest.mark.parametrize("io", IO_CHOICES)
def test_round_trip_is_bit_exact(
    tmp_path: Path, io: IOChoice, staging_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records in any slot order, adjacent and not, over more records than the staging rows hold at once
    (chunks of one or two records, alternating between the staging halves)."""
    monkeypatch.setattr(tier_module, "STAGING_BYTES", staging_rows * 4096)
    storage = open_tier(tmp_path / "spill", io)
    assert storage.file.io.name == io and len(storage.file.staging) == staging_rows and storage.capacity_slots == SLOTS
    slots = [7, 0, 1, 2, 11, 5, 4]
    written = records(len(slots))
    storage.write(slots, list(range(100, 107)), written)
    out = FORMAT.empty(len(slots))
    assert storage.read(slots, out) == []
    assert bits(out) == bits(written)
    order = [3, 0, 6]  # a subset, out of order
    out = FORMAT.empty(3)
    assert storage.read([slots[i] for i in order], out) == []
    assert bits(out) == bits([a[order] for a in written])
    storage.close()


def test_o_direct_where_the_filesystem_allows_it(tier: NvmeStorage, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError as exc:
        pytest.skip(f"this filesystem refuses O_DIRECT ({exc}); the tier runs buffered there")
    assert tier.direct
    data = tmp_path / "spill" / DATA_FILE
    assert data.stat().st_size == SLOTS * tier.codec.slot_bytes
    assert data.stat().st_blocks * 512 >= data.stat().st_size  # preallocated, not sparse


def test_unwritten_and_discarded_slots_are_lost(tier: NvmeStorage) -> None:
    tier.write([2, 3], [1, 2], records(2))
    tier.discard([3])
    assert tier.read([1, 2, 3], FORMAT.empty(3)) == [1, 3]


def corrupt(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0x40]), offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["payload", "header"])
def test_a_corrupt_record_is_lost_and_the_others_read(tier: NvmeStorage, tmp_path: Path, where: str) -> None:
    written = records(3)
    tier.write([0, 1, 2], [10, 11, 12], written)
    size = tier.codec.slot_bytes
    corrupt(tmp_path / "spill" / DATA_FILE, size + (HEADER.size + 100 if where == "payload" else 9))
    out = FORMAT.empty(3)
    assert tier.read([0, 1, 2], out) == [1]
    assert bits([a[[0, 2]] for a in out]) == bits([a[[0, 2]] for a in written])
    assert tier.read([1], FORMAT.empty(1)) == [1]  # forgotten, not read again


def test_a_truncated_file_loses_the_records_past_its_end(tier: NvmeStorage, tmp_path: Path) -> None:
    written = records(3)
    tier.write([0, 1, 2], [10, 11, 12], written)
    os.truncate(tmp_path / "spill" / DATA_FILE, tier.codec.slot_bytes + 1000)
    out = FORMAT.empty(3)
    assert tier.read([0, 1, 2], out) == [1, 2]
    assert bits([a[:1] for a in out]) == bits([a[:1] for a in written])


def test_a_record_under_another_key_is_lost(tier: NvmeStorage) -> None:
    """A stale record (its slot reassigned without a write) fails the key check."""
    tier.write([4], [40], records(1))
    tier._keys[4] = 41
    assert tier.read([4], FORMAT.empty(1)) == [4]


def test_a_binding_that_dies_on_this_processor_leaves_the_thread_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A binding built for other processor features dies of SIGILL when it makes a ring: the probe sees it in its
    child process, ``auto`` takes the thread pool and ``io_uring`` refuses with the reason."""
    pytest.importorskip("liburing")
    monkeypatch.setattr(uring_module, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    uring_module.binding_problem.cache_clear()
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
        with pytest.raises(uring_module.BindingCrashError) as refused:
            open_io(fd, [], "io_uring", threads=1)
        assert describe_failure(refused.value).endswith("(the process died of SIGILL)")
        io = open_io(fd, [], "auto", threads=1)
        assert io.name == "threads"
        io.close()
        os.close(fd)
    finally:
        uring_module.binding_problem.cache_clear()


def test_a_full_disk_at_start_is_refused(tmp_path: Path) -> None:
    """More than the disk has free is refused before anything is allocated."""
    disk = os.statvfs(tmp_path)
    with pytest.raises(StorageFullError, match="cannot create .* No space left"):
        NvmeStorage(TierSpec(FORMAT, 2 * disk.f_bavail * disk.f_frsize, tmp_path / "spill"))
    assert (tmp_path / "spill" / DATA_FILE).stat().st_blocks == 0
    storage = open_tier(tmp_path / "spill")  # the lock was released
    assert storage.capacity_slots == SLOTS
    storage.close()


def test_a_failed_preallocation_gives_its_space_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fallocate = os.posix_fallocate

    def fail_halfway(fd: int, offset: int, length: int) -> None:
        real_fallocate(fd, offset, length // 2)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fail_halfway)
    with pytest.raises(StorageFullError, match="No space left"):
        open_tier(tmp_path / "spill")
    assert (tmp_path / "spill" / DATA_FILE).stat().st_size == 0


def test_a_failing_write_is_storage_full_and_stores_nothing(tier: NvmeStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    tier.write([0], [1], records(1))

    def full(requests: object, write: bool) -> list[int]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tier.file.io, "start", full)
    with pytest.raises(StorageFullError, match="No space left"):
        tier.write([0, 1], [1, 2], records(2))
    monkeypatch.undo()
    assert tier.read([0, 1], FORMAT.empty(2)) == [0, 1]


def test_an_unwritable_path_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        open_tier(tmp_path / "file" / "spill")


def test_one_engine_per_directory(tier: NvmeStorage, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"in use by another engine \\(pid {os.getpid()}"):
        open_tier(tmp_path / "spill")
    tier.close()
    open_tier(tmp_path / "spill").close()


def test_persistence_keeps_keyed_records_of_the_same_identity(tmp_path: Path) -> None:
    written = records(3)
    first = open_tier(tmp_path / "spill", persist=True)
    first.write([5, 6, 7], [50, None, 70], written)
    first.close()
    assert (tmp_path / "spill" / INDEX_FILE).exists()
    again = open_tier(tmp_path / "spill", persist=True)
    assert again.persisted() == {5: 50, 7: 70}
    out = FORMAT.empty(2)
    assert again.read([5, 7], out) == []
    assert bits(out) == bits([a[[0, 2]] for a in written])
    again.close()
    other = open_tier(tmp_path / "spill", identity="model-b", persist=True)
    assert other.persisted() == {}
    other.close()


def test_without_persistence_nothing_survives_a_restart(tmp_path: Path) -> None:
    first = open_tier(tmp_path / "spill")
    first.write([1], [10], records(1))
    first.close()
    assert not (tmp_path / "spill" / INDEX_FILE).exists()
    again = open_tier(tmp_path / "spill", persist=True)
    assert again.persisted() == {} and again.read([1], FORMAT.empty(1)) == [1]
    again.close()
