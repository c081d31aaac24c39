"""Rank 0's posts to the other ranks of its own host through shared memory instead of their sockets.

A split model's decode step is a few milliseconds of GPU work, and every rank must start it before the
first collective can finish: the time from rank 0's post to the last rank's start is added to every step.
Over a TCP socket on one host that time is the sender's system call (which runs the receiver's network
stack) and the receiver's wake-up. Here rank 0 writes each post into a ring of slots in a file (in
``/dev/shm``) that every rank of the host maps, and the other ranks wait for it by reading the slot.

A slot holds the post's sequence number, its length and a CRC-32 of the three, written before the number:
a rank takes a slot once its number is the one it waits for and the CRC matches what it copied, so a slot
whose bytes are still arriving is read again, on every CPU's memory ordering. Each rank acknowledges what
it took in its own line of the file, and rank 0 reuses a slot only once every rank has taken the post
before it. A post larger than a slot is announced in the ring and sent over the socket (in order).

While posts keep coming a waiting rank polls the ring (yielding the CPU between reads), for ``spin_s``
after the last one; then it waits on its socket with a short timeout between reads of the ring, so an idle
replica costs no CPU, and a rank 0 that has gone (its socket closed) is noticed.
"""

from __future__ import annotations

import mmap
import os
import secrets
import select
import socket
import struct
import tempfile
import time
import zlib
from collections.abc import Sequence as Seq
from pathlib import Path

from atlas_core.comm import CommError
from atlas_core.comm.wire import PeerLostError

SHM_DIR = Path("/dev/shm")
"""Where the ring's file is made: memory on Linux; hosts without it use the temporary directory (the ranks map
the same pages of the page cache, and the file is removed once they have)."""
SLOTS = 32
SLOT_BYTES = 256 << 10
"""Payload bytes of a slot: a decode step's batch of 256 sequences fits; prefill with images may not."""
SLOT_HEADER = struct.Struct("<QQI")  # sequence number, length, CRC-32
HEADER_BYTES = 64
LINE_BYTES = 64
ON_SOCKET = 2**64 - 1
"""The length of a post that follows over the socket."""
POLL_S = 0.001


class PostRing:
    """One rank's map of the ring: rank 0 writes (`write`), the others read (`read`)."""

    def __init__(self, mapping: mmap.mmap, world_size: int, rank: int, spin_s: float) -> None:
        self.mapping, self.world_size, self.rank, self.spin_s = mapping, world_size, rank, spin_s
        self.buffer = memoryview(mapping)
        self.next = 1  # the sequence number of the next post

    @staticmethod
    def size(world_size: int) -> int:
        return world_size * LINE_BYTES + SLOTS * (HEADER_BYTES + SLOT_BYTES)

    @classmethod
    def create(cls, world_size: int, spin_s: float) -> tuple[PostRing, Path]:
        """Rank 0: a new ring for ``world_size`` ranks and the file the others map (`attach`); `OSError` when no
        such file can be made."""
        folder = SHM_DIR if os.access(SHM_DIR, os.W_OK) else Path(tempfile.gettempdir())
        path = folder / f"atlas-posts-{os.getpid()}-{secrets.token_hex(8)}"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(descriptor, cls.size(world_size))
            mapping = mmap.mmap(descriptor, cls.size(world_size))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(descriptor)
        return cls(mapping, world_size, 0, spin_s), path

    @classmethod
    def attach(cls, path: str, world_size: int, rank: int, spin_s: float) -> PostRing:
        """Rank ``rank``: map rank 0's ring at ``path`` (`OSError` when it is not on this host)."""
        descriptor = os.open(path, os.O_RDWR)
        try:
            if os.fstat(descriptor).st_size != cls.size(world_size):
                raise OSError(f"{path} is not a ring for {world_size} ranks")
            mapping = mmap.mmap(descriptor, cls.size(world_size))
        finally:
            os.close(descriptor)
        return cls(mapping, world_size, rank, spin_s)

    def close(self) -> None:
        self.buffer.release()
        self.mapping.close()

    def write(self, parts: list[memoryview], timeout_s: float, peers: Seq[socket.socket] = ()) -> bool:
        """Rank 0: post the message whose buffers are ``parts``; False when it is too large for a slot (its place in
        the ring says so, and the caller sends it over the sockets next). When every slot holds a post some rank
        has not taken, wait: `PeerLostError` as soon as one of the ranks' connections ``peers`` closes, `CommError`
        when a rank has taken nothing for ``timeout_s``."""
        number = self.next
        deadline = time.monotonic() + timeout_s
        while min(self._acknowledged(rank) for rank in range(1, self.world_size)) + SLOTS < number:
            if time.monotonic() > deadline:
                raise CommError(f"a rank took no post from rank 0 within {timeout_s:g} s; it is gone or stuck")
            if any(_closed(sock) for sock in select.select(list(peers), [], [], 0)[0]):
                raise PeerLostError("a rank's connection closed while rank 0 waited for it to take a post")
            time.sleep(POLL_S)
        length = sum(part.nbytes for part in parts)
        fits = length <= SLOT_BYTES
        slot = self._slot(number)
        start = end = slot + HEADER_BYTES
        if fits:
            for part in parts:
                self.buffer[end : end + part.nbytes] = part.cast("B")
                end += part.nbytes
        else:
            length = ON_SOCKET
        struct.pack_into("<QI", self.buffer, slot + 8, length, _crc(number, length, self.buffer[start:end]))
        struct.pack_into("<Q", self.buffer, slot, number)
        self.next += 1
        return fits

    def read(self, sock: socket.socket) -> bytearray | None:
        """Another rank: the next post (None: it follows over ``sock``). `PeerLostError` when rank 0's connection
        ``sock`` closes while this rank waits."""
        number, slot = self.next, self._slot(self.next)
        spin_until = time.monotonic() + self.spin_s
        closed = False  # rank 0's connection closed: one more look at the ring (its last post may be there)
        while True:
            seen, length, crc = SLOT_HEADER.unpack_from(self.buffer, slot)
            if seen == number:
                start = slot + HEADER_BYTES
                data = None if length == ON_SOCKET else bytearray(self.buffer[start : start + length])
                if crc == _crc(number, length, b"" if data is None else data):
                    struct.pack_into("<Q", self.buffer, self.rank * LINE_BYTES, number)
                    self.next += 1
                    return data
            elif seen > number:
                raise CommError(f"rank {self.rank} missed post {number} of rank 0 (the ring holds post {seen})")
            if closed:
                raise PeerLostError("the peer closed the connection (its process ended)")
            if time.monotonic() < spin_until:
                os.sched_yield()
            else:
                closed = bool(select.select([sock], [], [], POLL_S)[0]) and _closed(sock)

    def _slot(self, number: int) -> int:
        return self.world_size * LINE_BYTES + ((number - 1) % SLOTS) * (HEADER_BYTES + SLOT_BYTES)

    def _acknowledged(self, rank: int) -> int:
        return int(struct.unpack_from("<Q", self.buffer, rank * LINE_BYTES)[0])


def this_host() -> str:
    """This machine, as the ranks compare it before mapping rank 0's ring (a shared temporary directory on
    another host holds a file of the same name that is not the same memory): its name and boot id."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _closed(sock: socket.socket) -> bool:
    """Whether readable ``sock`` is at its end (the peer's process ended), without taking any of its bytes."""
    try:
        return not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True


def _crc(number: int, length: int, payload: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<QQ", number, length)))
