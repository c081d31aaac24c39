"""Where the ranks of one replica meet: rank 0 listens on ``master_addr:master_port``, every other rank
connects to it, and rank 0 checks that all agree (world size, Atlas version, model and parallel
settings) before any weights are read.

The connections stay open after the meeting: `Rendezvous.exchange` is a small all-gather of JSON
values (listener addresses for the CPU comm backend, the NCCL unique id), and rank 0 sends each
step's work to the other ranks over them (`post` / `receive`, `atlas_core.parallel`), or through shared
memory when all ranks run on one host (`share_posts`, `atlas_core.comm.post_ring`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.comm import CommError
from atlas_core.comm.post_ring import PostRing, this_host
from atlas_core.comm.wire import decode_message, encode_message, recv_message, send_message, send_parts

CONNECT_RETRY_S = 0.05
GONE_POLL_S = 0.2


@dataclass(frozen=True)
class WorldAddress:
    """One rank's place in the replica and where rank 0 listens. ``timeout_s`` bounds the meeting and
    every collective: a rank silent that long is taken for dead."""

    rank: int
    world_size: int
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise CommError(f"world size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise CommError(
                f"rank {self.rank} is outside a world of size {self.world_size} (ranks 0..{self.world_size - 1})"
            )
        if not 0 <= self.master_port < 65536:
            raise CommError(f"master port {self.master_port} is not a TCP port (0..65535)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (for rank 0 to listen on)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Rendezvous:
    """The meeting of every rank (`meet`), then a channel between rank 0 and each other rank."""

    def __init__(self, address: WorldAddress, peers: dict[int, socket.socket]) -> None:
        self.address = address
        self.rank, self.world_size = address.rank, address.world_size
        self.peers = peers
        """Rank 0: the connection to each other rank; other ranks: ``{0: the connection to rank 0}``."""
        self.ring: PostRing | None = None
        """Where `post` writes and `receive` reads when every rank is on rank 0's host (`share_posts`)."""

    @classmethod
    def meet(
        cls, address: WorldAddress, identity: dict[str, Any], gone: Callable[[], str | None] | None = None
    ) -> Rendezvous:
        """Meet every rank of ``address``'s world. ``identity`` (JSON values) must be equal on every rank:
        a rank whose identity differs from rank 0's is refused, and both sides raise `CommError` naming
        the settings that differ. Waits at most ``timeout_s`` for the others; rank 0 also stops waiting,
        with `CommError`, as soon as ``gone()`` (polled while it waits) names a rank that will not come
        (a process it started that exited)."""
        if address.world_size == 1:
            return cls(address, {})
        if address.rank == 0:
            return cls(address, _accept_ranks(address, identity, gone))
        return cls(address, {0: _join(address, identity)})

    @property
    def local_host(self) -> str:
        """This rank's address as its peers reach it (the interface its rendezvous connection uses)."""
        if not self.peers:
            return "127.0.0.1"
        return str(next(iter(self.peers.values())).getsockname()[0])

    def exchange(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (JSON), in rank order; every rank calls it with its own."""
        if self.world_size == 1:
            return [value]
        if self.rank == 0:
            values = [value] + [self._receive_from(rank)[0]["value"] for rank in range(1, self.world_size)]
            for rank in range(1, self.world_size):
                send_message(self.peers[rank], {"values": values})
            return values
        send_message(self.peers[0], {"value": value})
        return list(self._receive_from(0)[0]["values"])

    def share_posts(self, spin_s: float) -> bool:
        """Every rank at once: carry `post` / `receive` through shared memory (`PostRing`) when all ranks run on
        rank 0's host, waiting ranks polling it for ``spin_s`` after each post (0: they wait on their sockets,
        reading the ring every millisecond). Whether the ring is used (the same answer on every rank)."""
        if self.world_size == 1:
            return False
        path = None
        if self.rank == 0:
            try:
                self.ring, created = PostRing.create(self.world_size, spin_s)
                path = str(created)
            except OSError:
                path = None
        here = this_host()
        path, host = self.exchange([path, here])[0]
        if self.rank != 0 and path is not None and host == here:  # a file of the same name elsewhere is not it
            try:
                self.ring = PostRing.attach(path, self.world_size, self.rank, spin_s)
            except OSError:
                self.ring = None
        shared = all(self.exchange(self.ring is not None))
        if self.rank == 0 and path is not None:
            Path(path).unlink(missing_ok=True)  # every rank has mapped it (or will not): nothing left behind
        if not shared and self.ring is not None:
            self.ring.close()
            self.ring = None
        return shared

    def post(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Rank 0: send one message to every other rank."""
        parts = encode_message(header, arrays)
        if self.ring is not None and self.ring.write(parts, self.address.timeout_s, list(self.peers.values())):
            return
        for rank in range(1, self.world_size):
            try:
                send_parts(self.peers[rank], parts)
            except CommError as exc:
                raise CommError(f"rank {rank} stopped taking work: {exc}") from exc

    def receive(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Other ranks: the next message rank 0 posts (waits as long as it takes; `CommError` when rank 0 ends)."""
        self.peers[0].settimeout(None)
        if self.ring is not None:
            data = self.ring.read(self.peers[0])
            if data is not None:
                return decode_message(data)
        return recv_message(self.peers[0])

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close()
        self.peers = {}
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    def _receive_from(self, rank: int) -> tuple[dict[str, Any], list[np.ndarray]]:
        sock = self.peers[rank]
        sock.settimeout(self.address.timeout_s)
        try:
            return recv_message(sock)
        except CommError as exc:
            raise CommError(f"rank {self.rank}: rank {rank} did not answer: {exc}") from exc


def _accept_ranks(
    address: WorldAddress, identity: dict[str, Any], gone: Callable[[], str | None] | None
) -> dict[int, socket.socket]:
    """Rank 0: accept the other ranks' connections and check their hello (rank, world size, identity)."""
    listener = socket.create_server((address.master_addr, address.master_port), reuse_port=False)
    peers: dict[int, socket.socket] = {}
    deadline = time.monotonic() + address.timeout_s
    try:
        while len(peers) < address.world_size - 1:
            listener.settimeout(min(GONE_POLL_S, max(0.0, deadline - time.monotonic())))
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                reason = None if gone is None else gone()
                if reason is not None:
                    raise CommError(f"rank 0 stopped waiting for the other ranks: {reason}") from None
                if time.monotonic() < deadline:
                    continue
                missing = sorted(set(range(1, address.world_size)) - set(peers))
                raise CommError(
                    f"rank 0 waited {address.timeout_s:g} s at {address.master_addr}:{address.master_port} "
                    f"but ranks {missing} never came; start them with --rank N --world-size {address.world_size} "
                    f"--master-addr {address.master_addr} --master-port {address.master_port}"
                ) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(address.timeout_s)
            hello, _ = recv_message(sock)
            problem = _hello_problem(hello, address, identity, peers)
            if problem:
                send_message(sock, {"error": problem})
                sock.close()
                raise CommError(problem)
            peers[int(hello["rank"])] = sock
        for sock in peers.values():
            send_message(sock, {"ok": True})
    except BaseException:
        for sock in peers.values():
            sock.close()
        raise
    finally:
        listener.close()
    return peers


def _hello_problem(
    hello: dict[str, Any], address: WorldAddress, identity: dict[str, Any], peers: dict[int, socket.socket]
) -> str | None:
    """Why rank 0 refuses a joining rank's ``hello``, or None when it fits."""
    rank = hello.get("rank")
    if hello.get("world_size") != address.world_size:
        return (
            f"rank {rank} was started with world size {hello.get('world_size')} but rank 0 with "
            f"{address.world_size}; start every rank with the same --world-size"
        )
    if not isinstance(rank, int) or not 0 < rank < address.world_size or rank in peers:
        return f"a rank joined as rank {rank!r}, which is not free in a world of size {address.world_size}"
    theirs = hello.get("identity") or {}
    differing = sorted(key for key in identity.keys() | theirs.keys() if identity.get(key) != theirs.get(key))
    if differing:
        detail = ", ".join(
            f"{key}: rank 0 has {identity.get(key)!r}, rank {rank} {theirs.get(key)!r}" for key in differing
        )
        return f"rank {rank} does not match rank 0 ({detail}); start every rank with the same version and settings"
    return None


def _join(address: WorldAddress, identity: dict[str, Any]) -> socket.socket:
    """A rank other than 0: connect to rank 0 (retrying until it listens), say hello, await its answer."""
    deadline = time.monotonic() + address.timeout_s
    while True:
        try:
            sock = socket.create_connection((address.master_addr, address.master_port), timeout=address.timeout_s)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise CommError(
                    f"rank {address.rank} could not reach rank 0 at {address.master_addr}:{address.master_port} "
                    f"within {address.timeout_s:g} s ({exc})"
                ) from exc
            time.sleep(CONNECT_RETRY_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send_message(sock, {"rank": address.rank, "world_size": address.world_size, "identity": identity})
    answer, _ = recv_message(sock)
    if "error" in answer:
        sock.close()
        raise CommError(f"rank 0 refused rank {address.rank}: {answer['error']}")
    return sock
