"""Run a function on every rank of a small world, one process each, as multi-rank tests need.

``run_ranks(3, fn, *args)`` starts 3 processes (spawned: no state inherited from the test process),
calls ``fn(address, *args)`` in each with its `WorldAddress` (all meeting on a free local port), and
returns their results in rank order. A rank that raises fails the call with that rank's traceback;
a rank that ends without either, or does neither within ``timeout_s``, fails it too. ``fn`` must be importable
(a module-level function), and its arguments and result picklable. ``run_rank_threads`` runs ranks as threads
of this process instead, for tests whose transport is simulated in memory.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from atlas_core.comm.rendezvous import WorldAddress, free_port

POLL_S = 0.1


def _rank_main(results: Any, rank: int, address: WorldAddress, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        results.put((rank, True, fn(address, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    world_size: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0, comm_timeout_s: float | None = None
) -> list[Any]:
    """``fn(address, *args)`` on ranks ``0 .. world_size - 1``, each in its own process; the results in rank
    order. ``comm_timeout_s``: the addresses' ``timeout_s`` (default: ``timeout_s``)."""
    comm_timeout = timeout_s if comm_timeout_s is None else comm_timeout_s
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=_rank_main,
            args=(results, rank, WorldAddress(rank, world_size, "127.0.0.1", port, comm_timeout), fn, args),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(outcomes) < world_size:
            try:
                rank, ok, value = results.get(timeout=POLL_S)
                outcomes[rank] = (ok, value)
                continue
            except queue.Empty:
                pass
            missing = sorted(set(range(world_size)) - set(outcomes))
            dead = [rank for rank in missing if processes[rank].exitcode is not None]
            if dead and results.empty():
                codes = ", ".join(f"rank {rank}: {processes[rank].exitcode}" for rank in dead)
                raise AssertionError(f"ranks ended without a result (exit codes {codes})")
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks {missing} gave no result within {timeout_s:g} s")
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    failures = [f"rank {rank}:\n{value}" for rank, (ok, value) in sorted(outcomes.items()) if not ok]
    if failures:
        raise AssertionError("\n".join(failures))
    return [outcomes[rank][1] for rank in range(world_size)]


def run_rank_threads(world_size: int, fn: Callable[[int], Any], timeout_s: float = 30.0) -> list[Any]:
    """``fn(rank)`` for ranks ``0 .. world_size - 1``, each on its own thread of this process (for collectives
    whose transport a test simulates in memory); the results in rank order. The first exception a rank raises is
    raised here, and a rank still running after ``timeout_s`` fails the call."""
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    hung = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    if hung:
        raise AssertionError(f"ranks {hung} did not finish within {timeout_s} s")
    return results
