"""The ``cpu`` comm backend: every collective across 2 and 3 processes, and its failures."""

from __future__ import annotations

import os
import re
import time

import ml_dtypes
import numpy as np
import pytest

from atlas_core.comm import CommError
from atlas_core.comm.cpu import CpuComm
from atlas_core.comm.rendezvous import Rendezvous, WorldAddress
from atlas_core.plugins import get_registry
from atlas_core.testing.ranks import run_ranks


def connect(address: WorldAddress, identity: dict[str, object] | None = None) -> CpuComm:
    return CpuComm.connect(Rendezvous.meet(address, identity or {}), None)


def part(rank: int, dtype: str = "float32") -> np.ndarray:
    """Rank ``rank``'s input: distinct values per rank, exactly representable in bf16."""
    return (np.arange(12, dtype=np.float32).reshape(3, 4) * (rank + 1) / 4).astype(dtype)


def collectives(address: WorldAddress) -> dict[str, np.ndarray]:
    comm = connect(address)
    rank, world = comm.rank, comm.world_size
    out: dict[str, np.ndarray] = {}
    reduced = part(rank)
    assert comm.all_reduce(reduced) is reduced
    out["all_reduce"] = reduced
    out["all_reduce_bf16"] = comm.all_reduce(part(rank, "bfloat16")).astype(np.float32)
    out["all_gather_0"] = comm.all_gather(part(rank), axis=0)
    out["all_gather_1"] = comm.all_gather(part(rank)[:, : rank + 1], axis=1)  # uneven parts
    root_data = part(rank) if rank == world - 1 else np.zeros((3, 4), np.float32)
    out["broadcast"] = comm.broadcast(root_data, root=world - 1)
    # a ring: each rank sends to the next and receives from the previous
    comm.send(np.full(5, rank, np.int64), (rank + 1) % world)
    out["recv"] = comm.recv(np.empty(5, np.int64), (rank - 1) % world)
    comm.close()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_matches_its_definition(world: int) -> None:
    results = run_ranks(world, collectives)
    parts = [part(rank) for rank in range(world)]
    for rank, out in enumerate(results):
        np.testing.assert_array_equal(out["all_reduce"], sum(parts))
        np.testing.assert_array_equal(out["all_reduce_bf16"], sum(parts))
        np.testing.assert_array_equal(out["all_gather_0"], np.concatenate(parts, axis=0))
        np.testing.assert_array_equal(
            out["all_gather_1"], np.concatenate([p[:, : r + 1] for r, p in enumerate(parts)], axis=1)
        )
        np.testing.assert_array_equal(out["broadcast"], parts[-1])
        np.testing.assert_array_equal(out["recv"], np.full(5, (rank - 1) % world))


def reduce_random(address: WorldAddress) -> np.ndarray:
    comm = connect(address)
    values = np.random.default_rng(address.rank).standard_normal((64, 33)).astype(ml_dtypes.bfloat16)
    try:
        return comm.all_reduce(values).view(np.uint16)
    finally:
        comm.close()  # its senders finish: a rank that got every part must not end before the others got its own


def test_all_reduce_gives_every_rank_bitwise_the_same_sum() -> None:
    first, *others = run_ranks(3, reduce_random)
    for other in others:
        np.testing.assert_array_equal(first, other)


def mismatched_collectives(address: WorldAddress) -> str:
    comm = connect(address)
    try:
        if comm.rank == 0:
            comm.all_reduce(np.ones(3, np.float32))
        else:
            comm.all_gather(np.ones(3, np.float32))
    except CommError as exc:
        return str(exc)
    return "no error"


def test_ranks_calling_different_collectives_get_an_error() -> None:
    messages = run_ranks(2, mismatched_collectives)
    assert "rank 0 called all_reduce while rank 1 called all_gather" in messages[0]
    assert "rank 1 called all_gather while rank 0 called all_reduce" in messages[1]


def leaves_or_waits(address: WorldAddress) -> str:
    comm = connect(address)
    if comm.rank == 1:
        comm.close()  # what the operating system does to the sockets of a process that dies
        return "left"
    try:
        comm.all_reduce(np.ones(3, np.float32))
    except CommError as exc:
        return str(exc)
    return "no error"


def test_a_rank_that_leaves_ends_the_collective_with_an_error() -> None:
    message, _ = run_ranks(2, leaves_or_waits, timeout_s=20)
    assert re.search(r"rank 0: all_reduce with rank 1 failed: .*(closed the connection|connection .* broke)", message)


def exits_at_once(address: WorldAddress) -> None:
    if address.rank == 1:
        os._exit(3)


def test_run_ranks_reports_a_rank_that_ends_without_a_result() -> None:
    with pytest.raises(AssertionError, match="rank 1: 3"):
        run_ranks(2, exits_at_once)


def silent_peer(address: WorldAddress) -> str:
    comm = connect(address)
    if comm.rank == 1:
        time.sleep(3)  # past rank 0's timeout, with its sockets open
        return "stayed silent"
    try:
        comm.recv(np.empty(3, np.float32), 1)
    except CommError as exc:
        return str(exc)
    return "no error"


def test_a_silent_peer_times_out() -> None:
    message, _ = run_ranks(2, silent_peer, timeout_s=20, comm_timeout_s=1)
    assert "no message from the peer within 1" in message


def joins_with(address: WorldAddress, version: str) -> str:
    try:
        connect(address, {"version": version if address.rank else "1.0"})
    except CommError as exc:
        return str(exc)
    return "joined"


def test_ranks_with_different_settings_are_refused_at_the_meeting() -> None:
    messages = run_ranks(2, joins_with, "2.0", timeout_s=20)
    assert all("version: rank 0 has '1.0', rank 1 '2.0'" in message for message in messages)


def test_a_world_size_mismatch_is_refused() -> None:
    with pytest.raises(CommError, match="rank 1 is outside a world of size 1"):
        WorldAddress(1, 1)


def test_cpu_and_single_are_registered_comm_backends() -> None:
    registry = get_registry()
    assert registry.load("comm", "cpu") is CpuComm
    assert {"single", "cpu"} <= set(registry.names("comm"))
