"""The peer-memory all-reduce's setup and dispatch without a GPU: CuPy's runtime calls are replaced by fakes
whose ranks are threads of this process, so `PeerAllReduce.connect`'s agreement (every rank uses the peer
kernel, or none does) and `NcclComm`'s choice of path are checked for real. The kernel itself runs in
``plugins/comm/scripts/check_nccl.py`` on GPUs."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from atlas_comm_nccl import peer_reduce
from atlas_comm_nccl.nccl import NcclComm
from atlas_comm_nccl.peer_reduce import MAX_BYTES, PeerAllReduce

from atlas_core.comm import CommError
from atlas_core.testing.ranks import run_rank_threads


class ThreadRendezvous:
    """`Rendezvous.exchange` between threads: every rank's value, in rank order."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=10)
        self.values: dict[int, Any] = {}

    def rank(self, rank: int) -> Any:
        return SimpleNamespace(rank=rank, world_size=self.world_size, exchange=lambda v: self._exchange(rank, v))

    def _exchange(self, rank: int, value: Any) -> list[Any]:
        self.values[rank] = value
        self.barrier.wait()
        values = [self.values[r] for r in range(self.world_size)]
        self.barrier.wait()
        return values


class Arrays:
    """Host arrays standing in for CuPy's: ``data.ptr`` and ``nbytes`` as CuPy has them."""

    def __init__(self, array: np.ndarray, ptr: int = 4096) -> None:
        self.array, self.dtype, self.nbytes = array, array.dtype, array.nbytes
        self.data = SimpleNamespace(ptr=ptr)


class Host(np.ndarray):
    """A host array with CuPy's ``data.ptr`` (NCCL's fake takes addresses)."""

    def __new__(cls, array: np.ndarray) -> Host:
        return np.ascontiguousarray(array).view(cls)

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.ctypes.data)


class FakeSums:
    """The sums of one clique: the kernel's effect (every rank's array summed in rank order), between threads."""

    def __init__(self, world_size: int, wrong_rank: int | None = None) -> None:
        self.barrier = threading.Barrier(world_size, timeout=10)
        self.parts: dict[int, np.ndarray] = {}
        self.wrong_rank = wrong_rank

    def kernel(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        x, rank = args[0], int(args[5])
        self.parts[rank] = x.copy()
        self.barrier.wait()
        total = sum(self.parts[r] for r in sorted(self.parts))
        self.barrier.wait()
        x[...] = total + (1 if rank == self.wrong_rank else 0)


def fake_xp(rank: int, sums: FakeSums, released: list[tuple[int, str, int]], fails_to_map: bool) -> Any:
    """The CuPy calls `PeerAllReduce` makes, for rank ``rank``; unmaps and frees are logged in ``released``."""

    def open_handle(handle: bytes, flags: int) -> int:
        if fails_to_map:
            raise RuntimeError("cudaErrorPeerAccessUnsupported")
        return 1000 + handle[0]

    runtime = SimpleNamespace(
        malloc=lambda size: 100 + rank,
        memset=lambda ptr, value, size: None,
        ipcGetMemHandle=lambda ptr: bytes([ptr % 256]) * 64,
        ipcOpenMemHandle=open_handle,
        cudaIpcMemLazyEnablePeerAccess=1,
        ipcCloseMemHandle=lambda ptr: released.append((rank, "unmap", ptr)),
        free=lambda ptr: released.append((rank, "free", ptr)),
    )
    stream = SimpleNamespace(synchronize=lambda: None)
    module = SimpleNamespace(get_function=lambda name: sums.kernel)
    return SimpleNamespace(
        asarray=np.asarray,
        zeros=np.zeros,
        full=lambda shape, value, dtype: Host(np.full(shape, value, dtype)),
        RawModule=lambda code, options: module,
        cuda=SimpleNamespace(
            runtime=runtime, get_current_stream=lambda: stream, Device=lambda: SimpleNamespace(synchronize=lambda: None)
        ),
    )


def connect_all(
    world: int, *, fails_to_map: int | None = None, wrong_rank: int | None = None
) -> tuple[list[Any], list]:
    rendezvous, sums, released = ThreadRendezvous(world), FakeSums(world, wrong_rank), []
    results = run_rank_threads(
        world,
        lambda rank: PeerAllReduce.connect(rendezvous.rank(rank), fake_xp(rank, sums, released, fails_to_map == rank)),
    )
    return results, released


def test_every_rank_maps_every_other_ranks_buffer() -> None:
    reducers, released = connect_all(3)
    assert all(isinstance(r, PeerAllReduce) for r in reducers)
    # rank r's addresses: its own allocation (100 + r), the others' as mapped (1000 + their handle byte)
    assert [list(r.bases) for r in reducers] == [[100, 1101, 1102], [1100, 101, 1102], [1100, 1101, 102]]
    assert released == []


@pytest.mark.parametrize("failure", ["map", "wrong sum"])
def test_when_one_rank_cannot_take_part_no_rank_does(failure: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "atlas.comm")
    if failure == "map":
        reducers, released = connect_all(2, fails_to_map=1)
    else:
        reducers, released = connect_all(2, wrong_rank=1)
    assert reducers == [None, None]
    assert (0, "free", 100) in released and (1, "free", 101) in released
    assert "all-reduce runs through NCCL only: rank 1" in caplog.text


def test_one_rank_or_the_switch_off_sets_up_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connect_all(1)[0] == [None]
    monkeypatch.setenv("ATLAS_PEER_ALL_REDUCE", "0")
    assert connect_all(2)[0] == [None, None]


def test_the_switch_off_on_one_rank_alone_turns_every_rank_to_nccl(caplog: pytest.LogCaptureFixture) -> None:
    """Each rank reads its own environment: a rank with the switch off still takes part in the agreement."""
    caplog.set_level(logging.INFO, "atlas.comm")
    rendezvous, sums, released = ThreadRendezvous(2), FakeSums(2), []

    off = threading.local()  # each rank (thread) its own environment

    def connect(rank: int) -> Any:
        off.value = rank == 1
        return PeerAllReduce.connect(rendezvous.rank(rank), fake_xp(rank, sums, released, False))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peer_reduce, "switched_off", lambda: off.value)
        assert run_rank_threads(2, connect) == [None, None]
    assert "rank 1 has ATLAS_PEER_ALL_REDUCE=0" in caplog.text
    assert (0, "free", 100) in released


def test_a_sum_that_never_finishes_names_the_switch() -> None:
    reducer = PeerAllReduce.__new__(PeerAllReduce)
    reducer.rank, reducer.world_size = 1, 2
    reducer.xp = SimpleNamespace(full=np.full)

    def trapped(x: Any, timeout_s: float) -> Any:
        raise RuntimeError("cudaErrorLaunchFailure: unspecified launch failure")

    reducer.all_reduce = trapped  # type: ignore[method-assign]
    with pytest.raises(CommError, match="ATLAS_PEER_ALL_REDUCE=0"):
        reducer.check()


@pytest.mark.parametrize(
    ("array", "ptr", "peer"),
    [
        (np.zeros(4096, ml_dtypes.bfloat16), 4096, True),  # a decode step's hidden row
        (np.zeros(8, np.float32), 4096, True),
        (np.zeros(4, np.float16), 4096, False),  # 8 bytes: not a whole vector
        (np.zeros(4096, ml_dtypes.bfloat16), 4098, True),  # summed as an aligned copy: the same path on every rank
        (np.zeros(MAX_BYTES // 2 + 8, ml_dtypes.bfloat16), 4096, False),  # larger than the peer buffers
        (np.zeros(64, np.int32), 4096, False),  # no kernel for it
    ],
)
def test_small_aligned_float_arrays_take_the_peer_kernel(array: np.ndarray, ptr: int, peer: bool) -> None:
    reducer = PeerAllReduce.__new__(PeerAllReduce)
    reducer.kernels = {np.dtype(d): None for d in (np.float32, ml_dtypes.bfloat16, np.float16)}
    assert reducer.takes(Arrays(array, ptr)) is peer


def test_nccl_comm_sends_what_the_peer_kernel_takes_there() -> None:
    class Peer:
        def __init__(self) -> None:
            self.summed: list[int] = []

        def takes(self, x: Any) -> bool:
            return x.size <= 4

        def all_reduce(self, x: Any, timeout_s: float) -> Any:
            self.summed.append(x.size)
            return x

    calls: list[str] = []
    communicator = SimpleNamespace(allReduce=lambda *args: calls.append("nccl"))
    stream = SimpleNamespace(ptr=0, is_capturing=lambda: True)
    xp = SimpleNamespace(ndarray=Host, cuda=SimpleNamespace(get_current_stream=lambda: stream))
    nccl = SimpleNamespace(NCCL_SUM=0, NCCL_FLOAT32=7)
    peer = Peer()
    comm = NcclComm(0, 2, communicator, nccl, xp, 5.0, peer)  # type: ignore[arg-type]
    comm.all_reduce(Host(np.zeros(4, np.float32)))
    comm.all_reduce(Host(np.zeros(64, np.float32)))
    assert peer.summed == [4] and calls == ["nccl"]
