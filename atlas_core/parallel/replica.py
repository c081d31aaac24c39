"""Rank 0 of a split replica: start the other ranks (`StartedRanks`: processes of this host, or actors of a
Ray cluster, `atlas_core.parallel.ray_ranks`; none when they were started by hand), meet them, load rank 0's
shard, and watch the others for the rest of the replica's life.

`load_engine_model` is what `LLM` and ``atlas serve`` call: the plain `load_model` when
``tensor_parallel_size`` and ``expert_parallel_size`` are 1, else rank 0's shard whose
``model.mirror`` (a `RankMirror`) posts each step to the other ranks. The replica fails (the mirror
records a `CommError`) as soon as another rank reports an error or its connection ends, even while
the engine is idle; ``mirror.close()`` (`Replica.close`) stops the ranks and reaps the processes
(or actors) started for them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import threading
from dataclasses import replace

from atlas_core.backends.base import Backend
from atlas_core.comm import CommError
from atlas_core.comm.rendezvous import WorldAddress, free_port
from atlas_core.comm.wire import recv_message
from atlas_core.errors import ConfigError
from atlas_core.model.load import LoadedModel
from atlas_core.parallel.mirror import RankMirror
from atlas_core.parallel.settings import ReplicaSettings
from atlas_core.parallel.world import World, join_replica, load_shard
from atlas_core.plugins import PluginRegistry

log = logging.getLogger("atlas.parallel")

WATCH_POLL_S = 0.2
STOP_WAIT_S = 10.0


class StartedRanks:
    """Ranks 1.. as rank 0 started them; this base class is ranks started by hand (nothing to watch or stop).

    `LocalRanks` are processes of this host (``distributed_executor_backend`` ``mp``),
    `atlas_core.parallel.ray_ranks.RayRanks` actors of a Ray cluster (``ray``)."""

    processes: list[subprocess.Popen[bytes]] = []
    """The processes of this host that run the ranks (none for ranks this host does not run)."""

    def gone(self) -> str | None:
        """Why one of the ranks will not join (it ended before it did), or None while all may still come."""
        return None

    def stop(self) -> None:
        """After rank 0 told the ranks to stop (or their connections closed): wait up to `STOP_WAIT_S` for
        them to end, end those still running, and release what was held for them."""

    def kill(self) -> None:
        """The start failed: end the ranks now and release what was held for them."""
        self.stop()


class LocalRanks(StartedRanks):
    """Ranks 1.. as processes of this host (`start_local_ranks`), in rank order."""

    def __init__(self, processes: list[subprocess.Popen[bytes]]) -> None:
        self.processes = processes

    def gone(self) -> str | None:
        return exited(self.processes)

    def stop(self) -> None:
        stop_processes(self.processes)

    def kill(self) -> None:
        for process in self.processes:
            process.kill()
        stop_processes(self.processes)


class Replica:
    """Rank 0's hold on the other ranks: the joined `World`, the `RankMirror` that posts to them, how they
    were started (`StartedRanks`: the processes or actors to reap, none when started by hand), and a
    watchdog thread."""

    def __init__(self, world: World, backend: Backend, ranks: StartedRanks) -> None:
        self.world, self.ranks = world, ranks
        self.processes = ranks.processes
        self.mirror = RankMirror(world, backend, self.close)
        self._closing = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="atlas-replica-watch", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        """Fail the replica when another rank reports an error or its connection ends (it died)."""
        ranks = {sock: rank for rank, sock in self.world.rendezvous.peers.items()}
        while not self._closing.is_set():
            try:
                readable, _, _ = select.select(list(ranks), [], [], WATCH_POLL_S)
            except (OSError, ValueError):  # the sockets were closed under us: the replica is closing
                return
            for sock in readable:
                rank = ranks[sock]
                try:
                    header, _ = recv_message(sock)
                    error = CommError(f"rank {rank} failed: {header.get('error', f'it sent {header!r}')}")
                except CommError:
                    error = CommError(f"rank {rank} ended: its process exited or its connection broke")
                if not self._closing.is_set():
                    self.mirror.fail(error)
                return

    def close(self) -> None:
        """Tell the other ranks to stop, close the connections, and stop what ran them (`StartedRanks.stop`:
        processes or actors still running after `STOP_WAIT_S` are killed). Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self.mirror.failure is None:
            try:
                self.world.rendezvous.post({"op": "stop"})
            except CommError:
                pass
        self._watchdog.join(timeout=2 * WATCH_POLL_S + 1)
        self.world.close()
        self.ranks.stop()


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """Wait up to `STOP_WAIT_S` for ``processes`` to end, kill those still running, and reap them all."""
    for process in processes:
        try:
            process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("rank process %d did not stop; killing it", process.pid)
            process.kill()
            process.wait()


def worker_spec(
    model: str | None, backend_name: str, settings: ReplicaSettings, address: WorldAddress, rank: int
) -> str:
    """The argument of the worker entry (`atlas_core.parallel.worker.main`) for rank ``rank`` of ``address``'s
    replica: JSON of the model, the backend, the replica settings and the rank's address."""
    spec = {
        "model": model,
        "backend": backend_name,
        "settings": dataclasses.asdict(settings),
        "address": dataclasses.asdict(replace(address, rank=rank)),
    }
    return json.dumps(spec)


def start_local_ranks(
    model: str | None, backend_name: str, settings: ReplicaSettings, address: WorldAddress
) -> list[subprocess.Popen[bytes]]:
    """Start ranks ``1 .. world_size - 1`` of ``address``'s replica as processes of this host
    (``python -m atlas_core.parallel.worker``: a fresh interpreter, no CUDA context or threads inherited)."""
    processes = []
    for rank in range(1, address.world_size):
        spec = worker_spec(model, backend_name, settings, address, rank)
        command = [sys.executable, "-m", "atlas_core.parallel.worker", spec]
        processes.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, env=rank_environment(rank)))
    return processes


def exited(processes: list[subprocess.Popen[bytes]]) -> str | None:
    """Which of the rank processes (ranks 1, 2, ... in order) has exited, with its status; None while all run."""
    for rank, process in enumerate(processes, start=1):
        if process.poll() is not None:
            return f"rank {rank}'s process exited with status {process.returncode} before it joined"
    return None


def rank_environment(rank: int) -> dict[str, str]:
    """The environment of local rank ``rank``: this process's, with one GPU per rank: the rank's process sees
    only the ``rank``-th GPU this one sees (``CUDA_VISIBLE_DEVICES``), as its device 0; rank 0 uses its first."""
    env = dict(os.environ)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        env["CUDA_VISIBLE_DEVICES"] = str(rank)
    elif visible.strip():
        devices = visible.split(",")
        env["CUDA_VISIBLE_DEVICES"] = devices[rank % len(devices)]
    return env


def start_ranks(model: str | None, backend: Backend, settings: ReplicaSettings) -> tuple[StartedRanks, WorldAddress]:
    """Start ranks 1.. of the replica ``settings`` describe (none when they are started by hand), and rank 0's
    address for them to meet at: processes of this host, or Ray actors (which import Ray only now)."""
    if settings.distributed_executor_backend == "ray":
        from atlas_core.parallel.ray_ranks import start_ray_ranks

        return start_ray_ranks(model, backend, settings)
    port = settings.port or free_port(settings.master_addr)
    address = WorldAddress(0, settings.world, settings.master_addr, port, settings.comm_timeout)
    if settings.rank is not None:
        return StartedRanks(), address
    return LocalRanks(start_local_ranks(model, backend.name, settings, address)), address


def load_engine_model(
    model: str | None, backend: Backend, registry: PluginRegistry, settings: ReplicaSettings
) -> LoadedModel:
    """The model an engine runs: whole (one rank), or rank 0's shard of a split replica whose
    ``model.mirror`` posts each step to the other ranks (started here, unless ``settings.rank`` says they
    are started by hand) as ``settings.distributed_executor_backend`` says."""
    if settings.world == 1:
        return load_shard(model, backend, registry, settings, None)
    if settings.rank:
        raise ConfigError(f"rank {settings.rank} works for rank 0 (`atlas serve --rank {settings.rank}` runs it)")
    ranks, address = start_ranks(model, backend, settings)
    try:
        world = join_replica(model, backend, registry, settings, address, ranks.gone)
    except BaseException:
        ranks.kill()
        raise
    replica = Replica(world, backend, ranks)
    try:
        loaded = load_shard(model, backend, registry, settings, world)
        replica.mirror.guard(lambda: None)  # another rank failed to load: its error, now
    except BaseException:
        replica.close()
        raise
    loaded.model.mirror = replica.mirror
    return loaded
