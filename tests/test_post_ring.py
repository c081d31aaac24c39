"""Rank 0's posts through shared memory (`atlas_core.comm.post_ring`): what rank 0 writes is what the others
read, in order, with posts too large for a slot following over the socket, slots reused only once taken,
bytes still arriving never taken, and a rank 0 that is gone noticed. The split-model tests run whole replicas
over the ring."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from atlas_core.comm import CommError, post_ring
from atlas_core.comm.post_ring import SLOT_BYTES, SLOTS, PostRing
from atlas_core.comm.rendezvous import Rendezvous, WorldAddress
from atlas_core.comm.wire import PeerLostError, decode_message, encode_message, recv_message


@pytest.fixture
def ring_pair(tmp_path: Path) -> tuple[PostRing, PostRing, socket.socket, socket.socket]:
    """Rank 0's ring and rank 1's map of it (world of 2), and a connected socket pair (rank 0's end first)."""
    writer, path = PostRing.create(2, spin_s=0.0)
    reader = PostRing.attach(str(path), 2, 1, spin_s=0.0)
    path.unlink()
    ours, theirs = socket.socketpair()
    yield writer, reader, ours, theirs
    writer.close()
    reader.close()
    ours.close()
    theirs.close()


def test_posts_arrive_in_order_with_their_arrays(ring_pair: tuple) -> None:
    writer, reader, _, theirs = ring_pair
    for step in range(3 * SLOTS):  # around the ring three times, each post taken before the next
        arrays = [np.arange(step + 1, dtype=np.int32), np.full((2, 3), step, dtype=np.float32)]
        assert writer.write(encode_message({"op": "graph", "step": step}, arrays), timeout_s=1.0)
        header, got = decode_message(reader.read(theirs))
        assert header == {"op": "graph", "step": step}
        assert [a.tolist() for a in got] == [a.tolist() for a in arrays]
        got[0][0] = -1  # the arrays are the reader's own copy


def test_a_post_larger_than_a_slot_follows_over_the_socket_in_order(ring_pair: tuple) -> None:
    writer, reader, ours, theirs = ring_pair
    big = np.zeros(SLOT_BYTES // 4 + 1, dtype=np.int32)
    parts = encode_message({"op": "forward"}, [big])
    assert not writer.write(parts, timeout_s=1.0)
    sender = threading.Thread(target=ours.sendall, args=(b"".join(parts),))  # more than the socket buffers
    sender.start()
    assert writer.write(encode_message({"op": "graph"}), timeout_s=1.0)
    assert reader.read(theirs) is None
    header, arrays = recv_message(theirs)
    sender.join(timeout=5)
    assert header == {"op": "forward"} and arrays[0].shape == big.shape
    assert decode_message(reader.read(theirs))[0] == {"op": "graph"}


def test_a_slot_is_reused_only_once_every_rank_took_its_post(ring_pair: tuple) -> None:
    writer, reader, _, theirs = ring_pair
    for step in range(SLOTS):
        writer.write(encode_message({"step": step}), timeout_s=1.0)
    with pytest.raises(CommError, match="took no post from rank 0 within 0.2 s"):
        writer.write(encode_message({"step": SLOTS}), timeout_s=0.2)
    assert decode_message(reader.read(theirs))[0] == {"step": 0}
    writer.next = SLOTS + 1  # the refused post was not written; the first slot is free again
    assert writer.write(encode_message({"step": SLOTS}), timeout_s=0.2)


def test_a_slot_whose_bytes_do_not_match_its_crc_is_not_taken(ring_pair: tuple) -> None:
    writer, reader, _, theirs = ring_pair
    writer.write(encode_message({"op": "graph"}), timeout_s=1.0)
    slot = writer._slot(1)
    good = bytes(writer.buffer[slot + 16 : slot + 20])
    writer.buffer[slot + 16 : slot + 20] = struct.pack("<I", struct.unpack("<I", good)[0] ^ 1)  # a torn slot
    taken: list[object] = []
    thread = threading.Thread(target=lambda: taken.append(reader.read(theirs)))
    thread.start()
    time.sleep(0.05)
    assert not taken
    writer.buffer[slot + 16 : slot + 20] = good  # the rest of the post arrives
    thread.join(timeout=5)
    assert decode_message(taken[0])[0] == {"op": "graph"}


def test_rank_0s_last_post_is_taken_after_its_connection_closed(ring_pair: tuple) -> None:
    writer, reader, ours, theirs = ring_pair
    writer.write(encode_message({"op": "stop"}), timeout_s=1.0)
    ours.close()
    assert decode_message(reader.read(theirs))[0] == {"op": "stop"}
    with pytest.raises(PeerLostError):
        reader.read(theirs)


def test_rank_0_stops_waiting_for_a_slot_when_a_rank_is_gone(ring_pair: tuple) -> None:
    writer, _, ours, theirs = ring_pair
    for step in range(SLOTS):
        writer.write(encode_message({"step": step}), timeout_s=1.0)
    theirs.close()  # the rank that never took them ended
    started = time.monotonic()
    with pytest.raises(PeerLostError, match="connection closed"):
        writer.write(encode_message({"step": SLOTS}), timeout_s=30.0, peers=[ours])
    assert time.monotonic() - started < 5


def test_a_waiting_rank_notices_that_rank_0_is_gone(ring_pair: tuple) -> None:
    _, reader, ours, theirs = ring_pair
    ours.close()
    with pytest.raises(PeerLostError):
        reader.read(theirs)


def test_without_dev_shm_the_ring_is_a_file_of_the_temporary_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(post_ring, "SHM_DIR", tmp_path / "missing")
    monkeypatch.setattr(post_ring.tempfile, "gettempdir", lambda: str(tmp_path))
    ring, path = PostRing.create(2, spin_s=0.0)
    assert path.parent == tmp_path
    ring.close()


def test_ranks_that_cannot_share_a_ring_post_over_their_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(world_size: int, spin_s: float) -> None:
        raise OSError("no room")

    monkeypatch.setattr(PostRing, "create", refuse)
    from atlas_core.comm.rendezvous import free_port

    address = WorldAddress(0, 2, master_port=free_port(), timeout_s=10)
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        rendezvous = Rendezvous.meet(WorldAddress(r, 2, master_port=address.master_port, timeout_s=10), {})
        shared = rendezvous.share_posts(0.0)
        if r == 0:
            rendezvous.post({"op": "stop"})
        else:
            results[r] = rendezvous.receive()[0]
        results[-r - 1] = shared
        rendezvous.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert results == {1: {"op": "stop"}, -1: False, -2: False}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x01", "shorter than its length field"),
        (b"".join(encode_message({"op": "x"}, [np.ones(2, np.int32)]))[:-1], "do not match its header"),
        (struct.pack("<Q", 13) + b'{"arrays": []}'[:13], "malformed message header"),
        (struct.pack("<Q", 30) + b'{"header": {}, "arrays": [["int32", [-1]]]}'[:30], "malformed"),
    ],
)
def test_a_message_that_is_not_one_is_refused_by_name(data: bytes, problem: str) -> None:
    with pytest.raises(CommError, match=problem):
        decode_message(bytearray(data))


def test_negative_sizes_and_huge_arrays_are_refused() -> None:
    for shape, problem in (([-1], "negative size"), ([2**40], "bytes of arrays")):
        encoded = json.dumps({"header": {}, "arrays": [["int32", shape]]}).encode()
        with pytest.raises(CommError, match=problem):
            decode_message(bytearray(struct.pack("<Q", len(encoded)) + encoded))


def test_arrays_decoded_from_one_buffer_are_aligned() -> None:
    parts = encode_message({"op": "graph", "x": "odd length"}, [np.arange(3, dtype=np.int64), np.ones(5, np.int32)])
    _, arrays = decode_message(bytearray(b"".join(parts)))
    assert all(array.flags.aligned for array in arrays)
    assert parts[0].nbytes % 16 == 0
