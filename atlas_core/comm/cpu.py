"""``cpu``: a CommBackend for NumPy arrays with one process per rank, over TCP (one host or several).

Every pair of ranks holds one connection (rank j connects to rank i < j at the address i gave at
the rendezvous). Sends are queued to one sender thread per peer, so a rank never blocks sending
while its peer blocks sending back; receives block with the rendezvous timeout. Each message names
its collective, so ranks that call collectives in different orders get an error, not wrong numbers.

``all_reduce`` sums the ranks' parts in rank order, in float32 for float16 and bfloat16 arrays,
so every rank gets bitwise the same sum.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any

import numpy as np

from atlas_core.comm import CommBackend, CommError
from atlas_core.comm.rendezvous import Rendezvous
from atlas_core.comm.wire import recv_message, send_message

ACCUMULATE_IN_FLOAT32 = {np.dtype(np.float16), np.dtype("bfloat16")}


class _PeerSender:
    """A thread that sends one peer's queued messages in order; its first failure is kept for `check`."""

    def __init__(self, sock: socket.socket, peer: int) -> None:
        self.sock, self.peer = sock, peer
        self.messages: queue.Queue[tuple[dict[str, Any], np.ndarray] | None] = queue.Queue()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"atlas-comm-send-{peer}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (message := self.messages.get()) is not None:
            if self.failure is None:
                try:
                    send_message(self.sock, message[0], [message[1]])
                except BaseException as exc:  # reported to the caller by check()
                    self.failure = exc

    def put(self, header: dict[str, Any], array: np.ndarray) -> None:
        self.check()
        self.messages.put((header, array))

    def check(self) -> None:
        if self.failure is not None:
            raise CommError(f"sending to rank {self.peer} failed: {self.failure}") from self.failure

    def stop(self) -> None:
        self.messages.put(None)


class CpuComm(CommBackend):
    """Collectives over NumPy arrays between processes (`connect` builds one per rank)."""

    def __init__(self, rank: int, world_size: int, peers: dict[int, socket.socket], timeout_s: float) -> None:
        self.rank, self.world_size = rank, world_size
        self.peers = peers
        self.timeout_s = timeout_s
        self.senders = {peer: _PeerSender(sock, peer) for peer, sock in peers.items()}
        for sock in peers.values():
            sock.settimeout(timeout_s)

    @classmethod
    def connect(cls, rendezvous: Rendezvous, backend: Any) -> CpuComm:
        """Listen on an ephemeral port, swap addresses at ``rendezvous``, connect to every lower rank and
        accept every higher one."""
        rank, world = rendezvous.rank, rendezvous.world_size
        timeout = rendezvous.address.timeout_s
        listener = socket.create_server((rendezvous.local_host, 0))
        peers: dict[int, socket.socket] = {}
        try:
            table = rendezvous.exchange([rendezvous.local_host, listener.getsockname()[1]])
            for peer in range(rank):
                sock = socket.create_connection(tuple(table[peer]), timeout=timeout)
                send_message(sock, {"rank": rank})
                peers[peer] = sock
            listener.settimeout(timeout)
            while len(peers) < world - 1:
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    raise CommError(f"rank {rank}: the higher ranks did not connect within {timeout:g} s") from None
                sock.settimeout(timeout)
                hello, _ = recv_message(sock)
                peers[int(hello["rank"])] = sock
        except BaseException:
            for sock in peers.values():
                sock.close()
            raise
        finally:
            listener.close()
        for sock in peers.values():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(rank, world, peers, timeout)

    def all_reduce(self, x: Any) -> Any:
        parts = self._all_to_all_same("all_reduce", self._host(x))
        total = parts[0].astype(np.float32) if parts[0].dtype in ACCUMULATE_IN_FLOAT32 else parts[0].copy()
        for part in parts[1:]:
            total += part
        x[...] = total
        return x

    def all_gather(self, x: Any, axis: int = 0) -> Any:
        return np.concatenate(self._all_to_all_same("all_gather", self._host(x)), axis=axis)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        self._check_peer(root, allow_self=True)
        if self.rank == root:
            snapshot = np.array(self._host(x), copy=True)  # the caller may write x before it is sent
            for sender in self.senders.values():
                sender.put({"op": "broadcast"}, snapshot)
            return x
        x[...] = self._receive("broadcast", root, self._host(x))
        return x

    def send(self, x: Any, peer: int) -> None:
        self._check_peer(peer)
        self.senders[peer].put({"op": "send"}, np.array(self._host(x), copy=True))

    def recv(self, x: Any, peer: int) -> Any:
        self._check_peer(peer)
        x[...] = self._receive("send", peer, self._host(x))
        return x

    def close(self) -> None:
        for sender in self.senders.values():
            sender.stop()
        for sender in self.senders.values():
            sender.thread.join(timeout=self.timeout_s)
        for sock in self.peers.values():
            sock.close()
        self.peers, self.senders = {}, {}

    def _all_to_all_same(self, op: str, part: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``part`` of collective ``op``, in rank order (this rank's own included)."""
        snapshot = np.array(part, copy=True)  # the caller may write x before the sender has sent it
        for sender in self.senders.values():
            sender.put({"op": op}, snapshot)
        return [part if peer == self.rank else self._receive(op, peer, None) for peer in range(self.world_size)]

    def _receive(self, op: str, peer: int, like: np.ndarray | None) -> np.ndarray:
        """The next array from ``peer``, which must come from collective ``op`` (and match ``like``'s
        shape and dtype when given)."""
        self.senders[peer].check()
        try:
            header, arrays = recv_message(self.peers[peer])
        except CommError as exc:
            raise CommError(f"rank {self.rank}: {op} with rank {peer} failed: {exc}") from exc
        if header.get("op") != op:
            raise CommError(
                f"rank {self.rank} called {op} while rank {peer} called {header.get('op')}; every rank must call "
                "the same collectives in the same order"
            )
        (array,) = arrays
        if like is not None and (array.shape != like.shape or array.dtype != like.dtype):
            raise CommError(
                f"rank {self.rank}: {op} from rank {peer} carried {array.dtype}{list(array.shape)}, "
                f"this rank expected {like.dtype}{list(like.shape)}"
            )
        return array

    def _check_peer(self, peer: int, *, allow_self: bool = False) -> None:
        if not 0 <= peer < self.world_size or (peer == self.rank and not allow_self):
            raise ValueError(f"rank {self.rank} cannot address rank {peer} in a world of size {self.world_size}")

    @staticmethod
    def _host(x: Any) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise TypeError(
                f"the cpu comm backend takes NumPy arrays, got {type(x).__name__}; use a device comm backend "
                "(nccl) with device arrays"
            )
        return x
