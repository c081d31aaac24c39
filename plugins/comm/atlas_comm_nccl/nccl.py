"""``nccl``: a CommBackend for CuPy arrays over NCCL (``cupy.cuda.nccl``), one GPU per rank.

`NcclComm.connect` makes the NCCL unique id on rank 0 and hands it to the other ranks over the
rendezvous (its small JSON exchange), then builds the communicator on the current CUDA device: a
rank's process sees its own GPU as device 0 (`atlas_core.parallel.replica` starts local ranks with
``CUDA_VISIBLE_DEVICES`` set so; ranks started by hand set it themselves).

Collectives run on the current CuPy stream, in place where the contract says so, over C-contiguous
arrays of float32, float16, bfloat16, float64, int8, uint8, int32 or int64. NCCL's all-gather takes
equal parts from every rank. After each collective the rank waits for it to finish (`wait`), polling at
most ``timeout_s`` (the replica's ``comm_timeout``): a peer that died or hangs makes it raise `CommError`
instead of blocking forever, and the communicator is aborted. A collective called while the stream is
being captured into a CUDA graph is only recorded (nothing runs then): the ranks replay their graphs in
step, and each calls `wait` after a replay. Small all-reduces (a decode step's) take a one-shot kernel through
peer memory where the ranks can map each other's (`atlas_comm_nccl.peer_reduce`).
"""

from __future__ import annotations

import time
from typing import Any

import ml_dtypes
import numpy as np

from atlas_comm_nccl.peer_reduce import PeerAllReduce
from atlas_core.comm import CommBackend, CommError
from atlas_core.comm.rendezvous import Rendezvous

POLL_S = 0.0005
SPIN_S = 0.02
"""A wait polls without sleeping for this long first: a decode step's collectives finish within it, and a
sleep's wake-up (about ``POLL_S``) would be added to every step of a split model."""

NCCL_TYPES = {
    np.dtype(np.float32): "NCCL_FLOAT32",
    np.dtype(np.float16): "NCCL_FLOAT16",
    np.dtype(ml_dtypes.bfloat16): "NCCL_BFLOAT16",
    np.dtype(np.float64): "NCCL_FLOAT64",
    np.dtype(np.int8): "NCCL_INT8",
    np.dtype(np.uint8): "NCCL_UINT8",
    np.dtype(np.int32): "NCCL_INT32",
    np.dtype(np.int64): "NCCL_INT64",
}
"""NumPy dtype -> the ``cupy.cuda.nccl`` constant naming its NCCL data type."""


class NcclComm(CommBackend):
    """Collectives over CuPy arrays between the GPUs of a replica (`connect` builds one per rank).

    ``communicator``: a ``cupy.cuda.nccl.NcclCommunicator``; ``nccl``: the module holding the data-type
    constants; ``xp``: the array module (CuPy), whose current stream the collectives run on."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        communicator: Any,
        nccl: Any,
        xp: Any,
        timeout_s: float,
        peer: PeerAllReduce | None = None,
    ) -> None:
        """``peer``: the one-shot kernel that sums small arrays through peer memory (None: NCCL sums all)."""
        self.rank, self.world_size = rank, world_size
        self.communicator, self.nccl, self.xp = communicator, nccl, xp
        self.timeout_s = timeout_s
        self.peer = peer

    @classmethod
    def connect(cls, rendezvous: Rendezvous, backend: Any) -> NcclComm:
        """Rank 0 makes the NCCL unique id and every rank receives it at ``rendezvous``; each builds its
        communicator on its current CUDA device. `CommError` when NCCL cannot be loaded or set up."""
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError as exc:
            raise CommError(f"the nccl comm backend needs CuPy with NCCL (pip install atlas-comm-nccl): {exc}") from exc
        if not getattr(nccl, "available", False):
            raise CommError(
                "CuPy cannot load NCCL (libnccl.so.2); install nvidia-nccl-cu13 or choose another --comm-backend"
            )
        unique_id = list(nccl.get_unique_id()) if rendezvous.rank == 0 else None
        shared = rendezvous.exchange(unique_id)[0]
        try:
            try:
                communicator = nccl.NcclCommunicator(rendezvous.world_size, tuple(shared), rendezvous.rank)
            except TypeError:  # CuPy releases whose unique id is bytes, not a tuple of (signed) chars
                comm_id = bytes(value & 0xFF for value in shared)
                communicator = nccl.NcclCommunicator(rendezvous.world_size, comm_id, rendezvous.rank)
        except Exception as exc:  # NcclError: the message names NCCL's reason
            raise CommError(f"rank {rendezvous.rank}: NCCL could not set up the communicator: {exc}") from exc
        timeout_s = rendezvous.address.timeout_s
        peer = PeerAllReduce.connect(rendezvous, cupy)
        return cls(rendezvous.rank, rendezvous.world_size, communicator, nccl, cupy, timeout_s, peer)

    def all_reduce(self, x: Any) -> Any:
        """Sum ``x`` over the ranks in place: small arrays through peer memory where the replica has it
        (`PeerAllReduce`), others through NCCL."""
        count, dtype = self._buffer(x)
        peer = self.peer
        if peer is not None and peer.takes(x):
            # the kernel gives up later than this rank's wait, which ends the replica with a `CommError` first
            self._run("all_reduce", lambda _stream: peer.all_reduce(x, 2 * self.timeout_s))
            return x
        sum_op = self.nccl.NCCL_SUM
        self._run("all_reduce", lambda s: self.communicator.allReduce(_ptr(x), _ptr(x), count, dtype, sum_op, s))
        return x

    def all_gather(self, x: Any, axis: int = 0) -> Any:
        count, dtype = self._buffer(x)
        gathered = self.xp.empty((self.world_size, *x.shape), dtype=x.dtype)
        self._run("all_gather", lambda s: self.communicator.allGather(_ptr(x), _ptr(gathered), count, dtype, s))
        if axis % max(x.ndim, 1) == 0:
            return gathered.reshape(self.world_size * x.shape[0], *x.shape[1:])
        return self.xp.concatenate(list(gathered), axis=axis)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        return self._broadcast(x, root, wait=True)

    def broadcast_queued(self, x: Any, root: int = 0) -> Any:
        """`broadcast` launched on the current stream, without waiting for it (a later `wait` bounds it: one
        without a marker, or one given a marker taken after it)."""
        return self._broadcast(x, root, wait=False)

    def _broadcast(self, x: Any, root: int, wait: bool) -> Any:
        self._check_peer(root, allow_self=True)
        count, dtype = self._buffer(x)
        self._run("broadcast", lambda s: self.communicator.broadcast(_ptr(x), _ptr(x), count, dtype, root, s), wait)
        return x

    def send(self, x: Any, peer: int) -> None:
        self._check_peer(peer)
        count, dtype = self._buffer(x)
        self._run("send", lambda s: self.communicator.send(_ptr(x), count, dtype, peer, s))

    def recv(self, x: Any, peer: int) -> Any:
        self._check_peer(peer)
        count, dtype = self._buffer(x)
        self._run("recv", lambda s: self.communicator.recv(_ptr(x), count, dtype, peer, s))
        return x

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
            self.peer = None
        if self.communicator is not None:
            self.communicator.destroy()
            self.communicator = None

    def _buffer(self, x: Any) -> tuple[int, int]:
        """``(element count, NCCL data type)`` of ``x``; `TypeError` for arrays NCCL cannot take as they are."""
        if not isinstance(x, self.xp.ndarray):
            raise TypeError(
                f"the nccl comm backend takes CuPy arrays, got {type(x).__name__}; use the cpu comm backend with "
                "NumPy arrays"
            )
        if not x.flags.c_contiguous:
            raise TypeError("the nccl comm backend takes C-contiguous arrays")
        name = NCCL_TYPES.get(np.dtype(x.dtype))
        if name is None or not hasattr(self.nccl, name):
            raise TypeError(f"NCCL has no data type for {np.dtype(x.dtype).name}")
        return int(x.size), int(getattr(self.nccl, name))

    def mark(self) -> Any:
        """An event recorded on the current stream, after the work launched so far."""
        return self.xp.cuda.get_current_stream().record()

    def wait(self, mark: Any = None) -> None:
        self._wait("the step's collectives", mark)

    def _run(self, op: str, launch: Any, wait: bool = True) -> None:
        """Launch collective ``op`` on the current stream and, with ``wait``, wait for it, at most ``timeout_s``
        (never while the stream is being captured)."""
        if self.communicator is None:
            raise CommError(f"rank {self.rank}: {op} on a closed communicator")
        stream = self.xp.cuda.get_current_stream()
        try:
            launch(stream.ptr)
        except Exception as exc:  # NcclError
            raise CommError(f"rank {self.rank}: NCCL {op} failed: {exc}") from exc
        if wait and not stream.is_capturing():
            self._wait(f"NCCL {op}")

    def _wait(self, what: str, mark: Any = None) -> None:
        """Poll until the current stream has done its work (up to event ``mark``, given one), at most
        ``timeout_s``; past it, abort the communicator and raise `CommError` naming ``what``."""
        if self.communicator is None:
            raise CommError(f"rank {self.rank}: {what} on a closed communicator")
        done = self.xp.cuda.get_current_stream().record() if mark is None else mark
        start = time.monotonic()
        deadline = start + self.timeout_s
        while not done.done:
            now = time.monotonic()
            if now - start > SPIN_S:
                time.sleep(POLL_S)
            if now > deadline:
                self.communicator.abort()
                self.communicator = None
                raise CommError(
                    f"rank {self.rank}: {what} did not finish within {self.timeout_s:g} s; a rank is gone or stuck"
                )

    def _check_peer(self, peer: int, *, allow_self: bool = False) -> None:
        if not 0 <= peer < self.world_size or (peer == self.rank and not allow_self):
            raise ValueError(f"rank {self.rank} cannot address rank {peer} in a world of size {self.world_size}")


def _ptr(x: Any) -> int:
    """The device address of CuPy array ``x``'s first element."""
    return int(x.data.ptr)
