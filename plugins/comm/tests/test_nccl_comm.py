"""The ``nccl`` comm backend without a GPU: CuPy and ``cupy.cuda.nccl`` are replaced by host arrays that
expose a device-style ``data.ptr`` and by communicators whose ranks are threads of this process. They
do to the bytes at the given addresses what NCCL does, so `NcclComm`'s addresses, counts, data types,
reshaping, unique-id exchange and timeout are checked for real; only the transport is simulated.
``plugins/comm/scripts/check_nccl.py`` runs the real thing on GPUs."""

from __future__ import annotations

import ctypes
import queue
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from atlas_comm_nccl.nccl import NcclComm
from atlas_comm_nccl.peer_reduce import PeerAllReduce

from atlas_core.comm import CommError
from atlas_core.plugins import get_registry
from atlas_core.testing.ranks import run_rank_threads

CODES = {
    "NCCL_INT8": np.int8,
    "NCCL_UINT8": np.uint8,
    "NCCL_INT32": np.int32,
    "NCCL_INT64": np.int64,
    "NCCL_FLOAT16": np.float16,
    "NCCL_FLOAT32": np.float32,
    "NCCL_FLOAT64": np.float64,
    "NCCL_BFLOAT16": ml_dtypes.bfloat16,
}


class DeviceArray(np.ndarray):
    """A host array with CuPy's ``data.ptr``."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.ctypes.data)


def device(array: np.ndarray) -> DeviceArray:
    return np.ascontiguousarray(array).view(DeviceArray)


class Stream:
    """The current stream: ``record`` gives an event that is done at once, or never (a hung peer);
    ``capturing`` while a CUDA graph is being captured on it."""

    def __init__(self, finishes: bool = True) -> None:
        self.ptr, self.finishes, self.capturing = 0, finishes, False

    def record(self) -> Any:
        return SimpleNamespace(done=self.finishes)

    def is_capturing(self) -> bool:
        return self.capturing


def fake_cupy(stream: Stream | None = None) -> Any:
    """The parts of CuPy that `NcclComm` uses."""
    current = stream or Stream()
    return SimpleNamespace(
        ndarray=DeviceArray,
        empty=lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray),
        concatenate=lambda arrays, axis: device(np.concatenate(arrays, axis=axis)),
        cuda=SimpleNamespace(get_current_stream=lambda: current),
    )


def fake_nccl(world: FakeWorld | None = None) -> Any:
    """A ``cupy.cuda.nccl`` module whose communicators join ``world``."""
    module = SimpleNamespace(available=True, NCCL_SUM=0, get_unique_id=lambda: tuple(range(128)))
    for index, name in enumerate(CODES):
        setattr(module, name, index)
    module.NcclCommunicator = lambda size, unique_id, rank: FakeCommunicator(world or FakeWorld(size), rank)
    return module


def _view(ptr: int, count: int, code: int) -> np.ndarray:
    dtype = np.dtype(list(CODES.values())[code])
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count)


def _writable(ptr: int, count: int, code: int) -> np.ndarray:
    dtype = np.dtype(list(CODES.values())[code])
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.ndarray((count,), dtype=dtype, buffer=memoryview(raw).cast("B"))


class FakeWorld:
    """The ranks (threads) of one fake NCCL clique."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots: dict[int, np.ndarray] = {}
        self.mailboxes = {(src, dst): queue.Queue() for src in range(size) for dst in range(size)}

    def gather(self, rank: int, value: np.ndarray) -> list[np.ndarray]:
        self.slots[rank] = value
        self.barrier.wait()
        values = [self.slots[r] for r in range(self.size)]
        self.barrier.wait()
        return values


class FakeCommunicator:
    """NCCL's calls, done on host memory at the given addresses."""

    def __init__(self, world: FakeWorld, rank: int) -> None:
        self.world, self.rank = world, rank
        self.calls: list[str] = []

    def allReduce(self, send: int, recv: int, count: int, code: int, op: int, stream: int) -> None:  # noqa: N802
        self.calls.append("allReduce")
        parts = self.world.gather(self.rank, _view(send, count, code).copy())
        total = parts[0].astype(np.float32)
        for part in parts[1:]:
            total += part
        _writable(recv, count, code)[:] = total.astype(parts[0].dtype)

    def allGather(self, send: int, recv: int, count: int, code: int, stream: int) -> None:  # noqa: N802
        self.calls.append("allGather")
        parts = self.world.gather(self.rank, _view(send, count, code).copy())
        _writable(recv, count * self.world.size, code)[:] = np.concatenate(parts)

    def broadcast(self, send: int, recv: int, count: int, code: int, root: int, stream: int) -> None:
        self.calls.append("broadcast")
        parts = self.world.gather(self.rank, _view(send, count, code).copy())
        _writable(recv, count, code)[:] = parts[root]

    def send(self, send: int, count: int, code: int, peer: int, stream: int) -> None:
        self.calls.append("send")
        self.world.mailboxes[(self.rank, peer)].put(_view(send, count, code).copy())

    def recv(self, recv: int, count: int, code: int, peer: int, stream: int) -> None:
        self.calls.append("recv")
        _writable(recv, count, code)[:] = self.world.mailboxes[(peer, self.rank)].get(timeout=10)

    def abort(self) -> None:
        self.calls.append("abort")

    def destroy(self) -> None:
        self.calls.append("destroy")


def on_ranks(size: int, fn: Callable[[NcclComm], Any], stream: Stream | None = None) -> list[Any]:
    """``fn(comm)`` on ``size`` ranks (threads) of one fake clique; the results in rank order."""
    world, xp = FakeWorld(size), fake_cupy(stream)
    comms = [NcclComm(rank, size, FakeCommunicator(world, rank), fake_nccl(world), xp, 5.0) for rank in range(size)]
    return run_rank_threads(size, lambda rank: fn(comms[rank]))


def part(rank: int, dtype: Any = np.float32) -> DeviceArray:
    return device((np.arange(12, dtype=np.float32).reshape(3, 4) * (rank + 1) / 4).astype(dtype))


def collectives(comm: NcclComm) -> dict[str, np.ndarray]:
    rank, world = comm.rank, comm.world_size
    out: dict[str, np.ndarray] = {}
    reduced = part(rank)
    assert comm.all_reduce(reduced) is reduced
    out["all_reduce"] = np.asarray(reduced)
    out["all_reduce_bf16"] = np.asarray(comm.all_reduce(part(rank, ml_dtypes.bfloat16))).astype(np.float32)
    out["all_gather_0"] = np.asarray(comm.all_gather(part(rank), axis=0))
    out["all_gather_1"] = np.asarray(comm.all_gather(part(rank), axis=1))
    out["all_gather_last"] = np.asarray(comm.all_gather(part(rank), axis=-1))
    root_data = part(rank) if rank == world - 1 else device(np.zeros((3, 4), np.float32))
    out["broadcast"] = np.asarray(comm.broadcast(root_data, root=world - 1))
    if rank == 0 and world > 1:
        comm.send(device(np.full(5, 7, np.int64)), 1)
    elif rank == 1:
        out["recv"] = np.asarray(comm.recv(device(np.empty(5, np.int64)), 0))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_collective_matches_its_definition(world: int) -> None:
    results = on_ranks(world, collectives)
    parts = [np.asarray(part(rank)) for rank in range(world)]
    for out in results:
        np.testing.assert_array_equal(out["all_reduce"], sum(parts))
        np.testing.assert_array_equal(out["all_reduce_bf16"], sum(parts))
        np.testing.assert_array_equal(out["all_gather_0"], np.concatenate(parts, axis=0))
        np.testing.assert_array_equal(out["all_gather_1"], np.concatenate(parts, axis=1))
        np.testing.assert_array_equal(out["all_gather_last"], np.concatenate(parts, axis=1))
        np.testing.assert_array_equal(out["broadcast"], parts[-1])
    if world > 1:
        np.testing.assert_array_equal(results[1]["recv"], np.full(5, 7))


def test_arrays_nccl_cannot_take_are_refused() -> None:
    def misuse(comm: NcclComm) -> list[str]:
        messages = []
        for bad in (
            np.ones(3, np.float32),
            device(np.ones((4, 4), np.float32))[:, :2],
            device(np.ones(3, np.complex64)),
        ):
            with pytest.raises(TypeError) as caught:
                comm.all_reduce(bad)
            messages.append(str(caught.value))
        with pytest.raises(ValueError, match="cannot address rank 1 in a world of size 1"):
            comm.send(device(np.ones(2, np.float32)), 1)
        return messages

    (messages,) = on_ranks(1, misuse)
    assert "takes CuPy arrays, got ndarray" in messages[0]
    assert "C-contiguous" in messages[1]
    assert "no data type for complex64" in messages[2]


def test_a_collective_that_never_finishes_times_out_and_aborts() -> None:
    world = FakeWorld(1)
    communicator = FakeCommunicator(world, 0)
    comm = NcclComm(0, 1, communicator, fake_nccl(world), fake_cupy(Stream(finishes=False)), 0.2)
    started = time.monotonic()
    with pytest.raises(CommError, match=r"NCCL all_reduce did not finish within 0.2 s; a rank is gone or stuck"):
        comm.all_reduce(device(np.ones(3, np.float32)))
    assert time.monotonic() - started < 2
    assert communicator.calls == ["allReduce", "abort"]
    with pytest.raises(CommError, match="closed communicator"):
        comm.all_reduce(device(np.ones(3, np.float32)))


def test_collectives_captured_into_a_graph_are_waited_for_after_the_replay() -> None:
    """While the stream is capturing, a collective is only recorded (waiting then would be an illegal event
    query, and nothing has run); the rank's `wait` after a replay is the bounded wait."""
    world, stream = FakeWorld(1), Stream(finishes=False)
    communicator = FakeCommunicator(world, 0)
    comm = NcclComm(0, 1, communicator, fake_nccl(world), fake_cupy(stream), 0.2)
    stream.capturing = True
    comm.all_reduce(device(np.ones(3, np.float32)))
    comm.all_gather(device(np.ones(3, np.float32)))
    stream.capturing = False
    assert communicator.calls == ["allReduce", "allGather"]
    with pytest.raises(CommError, match=r"rank 0: the step's collectives did not finish within 0.2 s"):
        comm.wait()
    assert communicator.calls[-1] == "abort"


def test_a_queued_broadcast_returns_at_once_and_a_marker_bounds_its_wait() -> None:
    """`broadcast_queued` launches without waiting (its peer may still be busy with the step before); `wait` on the
    marker taken after it is the bounded wait, and a marker whose work never finishes times out like a step."""
    world, stream = FakeWorld(1), Stream(finishes=False)
    communicator = FakeCommunicator(world, 0)
    comm = NcclComm(0, 1, communicator, fake_nccl(world), fake_cupy(stream), 0.2)
    ids = device(np.arange(4, dtype=np.int32))
    assert comm.broadcast_queued(ids, root=0) is ids
    assert communicator.calls == ["broadcast"]
    comm.wait(SimpleNamespace(done=True))  # the work before that marker has finished
    with pytest.raises(CommError, match=r"rank 0: the step's collectives did not finish within 0.2 s"):
        comm.wait(comm.mark())
    assert communicator.calls == ["broadcast", "abort"]


class FakeRendezvous:
    """What `NcclComm.connect` reads of a `Rendezvous`: rank 0's value goes to every rank."""

    def __init__(self, rank: int, world_size: int, shared: list[Any]) -> None:
        self.rank, self.world_size, self.shared = rank, world_size, shared
        self.address = SimpleNamespace(timeout_s=7.0)

    def exchange(self, value: Any) -> list[Any]:
        if self.rank == 0:
            self.shared.append(value)
        assert self.shared, "rank 0 exchanges first in this fake"
        return [self.shared[0]] + [None] * (self.world_size - 1)


def install_fake_cupy(monkeypatch: pytest.MonkeyPatch, nccl: Any) -> None:
    """CuPy and NCCL replaced; no peer-memory all-reduce (`test_peer_reduce.py` checks its setup)."""
    monkeypatch.setattr(PeerAllReduce, "connect", classmethod(lambda cls, rendezvous, xp: None))
    cupy = fake_cupy()
    cupy.cuda.nccl = nccl
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)


def test_connect_hands_rank_0s_unique_id_to_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[int, tuple[int, ...], int]] = []
    nccl = fake_nccl()
    nccl.NcclCommunicator = lambda size, unique_id, rank: made.append((size, unique_id, rank)) or object()
    install_fake_cupy(monkeypatch, nccl)
    shared: list[Any] = []
    comms = [NcclComm.connect(FakeRendezvous(rank, 2, shared), None) for rank in (0, 1)]  # type: ignore[arg-type]
    assert shared == [list(range(128))]
    assert made == [(2, tuple(range(128)), 0), (2, tuple(range(128)), 1)]
    assert [(c.rank, c.world_size, c.timeout_s) for c in comms] == [(0, 2, 7.0), (1, 2, 7.0)]


def test_connect_passes_a_bytes_unique_id_where_cupy_wants_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy releases whose NcclCommunicator takes the id as bytes (and refuses a tuple with TypeError)."""
    made: list[bytes] = []
    nccl = fake_nccl()
    nccl.get_unique_id = lambda: bytes(range(128))

    def communicator(size: int, unique_id: Any, rank: int) -> object:
        if not isinstance(unique_id, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(unique_id).__name__})")
        made.append(unique_id)
        return object()

    nccl.NcclCommunicator = communicator
    install_fake_cupy(monkeypatch, nccl)
    shared: list[Any] = []
    for rank in (0, 1):
        NcclComm.connect(FakeRendezvous(rank, 2, shared), None)  # type: ignore[arg-type]
    assert made == [bytes(range(128))] * 2


def test_connect_without_nccl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    nccl = fake_nccl()
    nccl.available = False
    install_fake_cupy(monkeypatch, nccl)
    with pytest.raises(CommError, match="cannot load NCCL.*nvidia-nccl-cu13"):
        NcclComm.connect(FakeRendezvous(0, 1, []), None)  # type: ignore[arg-type]


def test_nccl_is_a_registered_comm_backend() -> None:
    registry = get_registry()
    assert registry.load("comm", "nccl") is NcclComm
