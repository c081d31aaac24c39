"""One-shot all-reduce through peer memory: the small sums of a split model's decode steps in one kernel.

A decode step of a model split over ranks sums a few kilobytes after every row-parallel product (two per
layer). NCCL's ring all-reduce is built for bandwidth; at these sizes its latency is the cost. Here every
rank maps the other ranks' buffers (CUDA IPC; over NVLink on machines that have it) and one kernel per call
(``peer_all_reduce.cu``) writes the rank's part into every rank's buffer, flags its arrival there, waits for
the others' flags, and adds every rank's part in rank order from its own memory: one one-way trip over the
link, and the same bits on every rank. The kernel's arguments never change between calls, so CUDA graphs
capture it like any kernel.

`PeerAllReduce.connect` sets it up for a replica, or answers None when it cannot be used (one rank, more
than `MAX_RANKS`, the buffers of some rank cannot be mapped, a first sum gives a wrong result, or
``ATLAS_PEER_ALL_REDUCE=0``): every rank then takes the same answer, and all sums go through NCCL.
`NcclComm` sends arrays of at most `MAX_BYTES` (float32, bfloat16, float16, 16-byte aligned) here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from atlas_core.comm import CommError
from atlas_core.comm.rendezvous import Rendezvous

log = logging.getLogger("atlas.comm")

ENABLE_ENV = "ATLAS_PEER_ALL_REDUCE"
MAX_RANKS = 8
MAX_BYTES = 1 << 20
"""Arrays up to this size take the peer kernel (a decode step of up to 128 sequences of 4,096 bfloat16); larger
ones (prefill) go through NCCL, whose ring reads each byte once where this kernel reads it from every rank."""
BLOCKS = 32
"""Blocks of a call (the kernel is compiled with it); block b of every rank handles the same vectors."""
THREADS, FLAG_BYTES = 256, 4096  # as in peer_all_reduce.cu
CHECK_TIMEOUT_S = 30.0
"""The first sum (`connect`'s check) gives up after this long when a rank never arrives."""
KERNELS = {
    np.dtype(np.float32): "peer_all_reduce_f32",
    np.dtype(ml_dtypes.bfloat16): "peer_all_reduce_bf16",
    np.dtype(np.float16): "peer_all_reduce_f16",
}


class PeerAllReduce:
    """The peer-memory buffers of one rank of a replica and the kernels that sum through them."""

    def __init__(self, xp: Any, rank: int, world_size: int, own: int, opened: list[int], bases: list[int]) -> None:
        """``own``: this rank's allocation; ``opened``: the other ranks' as mapped here; ``bases``: every rank's
        address here, in rank order."""
        self.xp, self.rank, self.world_size = xp, rank, world_size
        self.own, self.opened = own, opened
        self.bases = xp.asarray(np.asarray(bases, dtype=np.uint64))
        self.counters = xp.zeros(BLOCKS, dtype=np.uint64)
        source = (Path(__file__).parent / "peer_all_reduce.cu").read_text()
        module = xp.RawModule(code=source, options=(f"-DBLOCKS={BLOCKS}",))
        self.kernels = {dtype: module.get_function(name) for dtype, name in KERNELS.items()}

    @classmethod
    def connect(cls, rendezvous: Rendezvous, xp: Any) -> PeerAllReduce | None:
        """Set up this rank's part with the other ranks of ``rendezvous`` (every rank calls it, at the same point);
        None on every rank when some rank cannot take part, with a log line saying why."""
        world, rank = rendezvous.world_size, rendezvous.rank
        if world == 1 or world > MAX_RANKS:  # every rank knows this alike: no need to agree
            return None
        own, handle, reason = 0, None, ""
        if switched_off():  # this rank's setting: the others hear of it below
            reason = f"rank {rank} has {ENABLE_ENV}=0"
        else:
            try:
                size = FLAG_BYTES + 2 * world * MAX_BYTES  # flags, then a slot per rank in each of two halves
                own = xp.cuda.runtime.malloc(size)
                xp.cuda.runtime.memset(own, 0, size)
                handle = list(xp.cuda.runtime.ipcGetMemHandle(own))
            except Exception as exc:  # noqa: BLE001 - any CUDA error: this rank cannot share memory
                reason = f"rank {rank} cannot share device memory ({exc})"
        handles = rendezvous.exchange(handle)
        opened: list[int] = []
        reducer = None
        if all(h is not None for h in handles):
            try:
                for peer, peer_handle in enumerate(handles):
                    if peer != rank:
                        flags = xp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess
                        opened.append(xp.cuda.runtime.ipcOpenMemHandle(bytes(peer_handle), flags))
                reducer = cls(xp, rank, world, own, opened, opened[:rank] + [own] + opened[rank:])
            except Exception as exc:  # noqa: BLE001 - no peer access between these devices, or no compiler
                reason = f"rank {rank} cannot map another rank's memory or build the kernel ({exc})"
        if _refused(rendezvous, reason) or reducer is None:
            _release(xp.cuda.runtime, own, opened)
            return None
        try:
            checked = reducer.check()
        except BaseException:
            reducer.close()
            raise
        if _refused(rendezvous, "" if checked else f"rank {rank}: the first sum through peer memory was wrong"):
            reducer.close()
            return None
        return reducer

    def takes(self, x: Any) -> bool:
        """Whether ``x`` (a C-contiguous CuPy array) is summed here: a dtype of `KERNELS`, at most `MAX_BYTES`, in
        whole 16-byte vectors. It depends only on what every rank's array has alike (not on its address)."""
        return np.dtype(x.dtype) in self.kernels and 0 < x.nbytes <= MAX_BYTES and x.nbytes % 16 == 0

    def all_reduce(self, x: Any, timeout_s: float) -> Any:
        """Sum ``x`` over the ranks in place, on the current stream (enqueued only; every rank must call it with an
        array of the same size and dtype). A rank missing for ``timeout_s`` makes the kernel trap."""
        if x.data.ptr % 16:  # the kernel moves 16 bytes at a time: sum an aligned copy
            aligned = x.copy()
            self.all_reduce(aligned, timeout_s)
            x[...] = aligned
            return x
        kernel = self.kernels[np.dtype(x.dtype)]
        vectors, timeout_ns = np.int64(x.nbytes // 16), np.uint64(int(timeout_s * 1e9))
        rank, world = np.int32(self.rank), np.int32(self.world_size)
        kernel(
            (BLOCKS,),
            (THREADS,),
            (x, x, vectors, self.bases, self.counters, rank, world, np.int64(MAX_BYTES), timeout_ns),
        )
        return x

    def check(self) -> bool:
        """One sum of known parts (rank r gives r + 1 in every value): every value must come out right."""
        x = self.xp.full(4096, self.rank + 1, dtype=np.float32)
        try:
            self.all_reduce(x, CHECK_TIMEOUT_S)
            self.xp.cuda.get_current_stream().synchronize()
        except Exception as exc:  # the kernel trapped: this GPU's work is lost, so the replica cannot start
            raise CommError(
                f"rank {self.rank}: a sum through peer memory did not finish ({exc}); start the replica with "
                f"{ENABLE_ENV}=0 to sum through NCCL only"
            ) from exc
        expected = self.world_size * (self.world_size + 1) / 2
        return bool((x == expected).all())

    def close(self) -> None:
        """Unmap the other ranks' buffers and free this rank's (the peers unmap theirs before they exit)."""
        self.xp.cuda.Device().synchronize()
        _release(self.xp.cuda.runtime, self.own, self.opened)
        self.own, self.opened = 0, []


def switched_off() -> bool:
    """Whether this process was told to sum through NCCL only (``ATLAS_PEER_ALL_REDUCE=0``)."""
    return os.environ.get(ENABLE_ENV, "1") == "0"


def _refused(rendezvous: Rendezvous, reason: str) -> bool:
    """Tell every rank this rank's ``reason`` not to use the peer kernel ("" for none); whether any rank has one
    (then logged): the ranks decide together, so that none waits in the kernel for a rank that never comes."""
    reasons = [r for r in rendezvous.exchange(reason) if r]
    if reasons:
        log.info("all-reduce runs through NCCL only: %s", "; ".join(reasons))
    return bool(reasons)


def _release(runtime: Any, own: int, opened: list[int]) -> None:
    for pointer in opened:
        runtime.ipcCloseMemHandle(pointer)
    if own:
        runtime.free(own)
