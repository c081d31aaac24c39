"""Ranks 1.. of a split replica as actors of a Ray cluster (``distributed_executor_backend="ray"``).

Rank 0 (the process that serves) connects to the cluster (`connect_ray`), reserves a placement group of
``world_size - 1`` bundles (one GPU each on a device backend, one CPU each on a host backend, packed on as
few nodes as fit) within ``comm_timeout`` (`reserve_bundles`), and starts one `RankActor` per bundle. Each
actor runs the worker entry (`atlas_core.parallel.worker.main`) with its rank, the world size and rank 0's
address, so the ranks meet at the same TCP rendezvous and run the same comm backends as processes started
on one host; an actor that dies closes its connection, which rank 0's watchdog reports as for any rank
(`atlas_core.parallel.replica.Replica`). `RayRanks.stop` kills the actors and removes the placement group
when the replica closes.

Ray is imported only here, and this module only when ``ray`` is chosen: `ConfigError` names the
``atlas-core[ray]`` extra when it is not installed. Every node must run the same Atlas, plugins and model
reference (the same path, or a Hugging Face repo id each node can read).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from types import ModuleType
from typing import Any

from atlas_core.backends.base import Backend
from atlas_core.comm import CommError
from atlas_core.comm.rendezvous import WorldAddress, free_port
from atlas_core.errors import ConfigError
from atlas_core.parallel.replica import STOP_WAIT_S, StartedRanks, worker_spec
from atlas_core.parallel.settings import ReplicaSettings

log = logging.getLogger("atlas.parallel")

RAY_EXTRA = "atlas-core[ray]"
"""What to install for ``distributed_executor_backend="ray"``."""


def import_ray() -> ModuleType:
    """The ``ray`` module; `ConfigError` naming `RAY_EXTRA` when it is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"distributed_executor_backend=ray needs Ray, which is not installed ({exc}); install it with "
            f"`pip install '{RAY_EXTRA}'`, or use distributed_executor_backend=mp"
        ) from exc
    return ray


def connect_ray(ray: ModuleType, address: str) -> bool:
    """Connect this process to the Ray cluster ``address`` names (see `ReplicaSettings.ray_address`): ``auto``,
    the running one (``RAY_ADDRESS``, else the one ``ray start`` runs on this host) or, when none runs and
    ``RAY_ADDRESS`` is unset, a new local one; ``local``, a new local one; else that cluster's address. A
    connection this process already has is kept whatever ``address`` says. True when this call connected
    (the caller disconnects when done)."""
    if ray.is_initialized():
        return False
    if address == "auto" and not os.environ.get("RAY_ADDRESS"):
        try:
            ray.init(address="auto")
        except ConnectionError:
            log.warning("no running Ray cluster was found; starting a local one on this host")
            ray.init(address="local", include_dashboard=False)
    else:
        ray.init(address=None if address == "auto" else address)
    return True


def reserve_bundles(ray: ModuleType, count: int, resource: str, timeout_s: float) -> Any:
    """A ready placement group of ``count`` bundles of one ``resource`` (``GPU`` or ``CPU``) each, packed on as
    few nodes as fit. `ConfigError` at once when the cluster does not have that many; `CommError` when they
    are not free within ``timeout_s`` (other work holds them)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    total = ray.cluster_resources().get(resource, 0)
    if total < count:
        raise ConfigError(
            f"the Ray cluster has {total:g} {resource}s, but ranks 1..{count} need {count} (one each; rank 0 runs "
            "in this process); add nodes, or lower tensor_parallel_size / expert_parallel_size"
        )
    group = placement_group([{resource: 1}] * count, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        free = ray.available_resources().get(resource, 0)
        raise CommError(
            f"the Ray cluster did not free {count} {resource}s for ranks 1..{count} within {timeout_s:g} s "
            f"(comm_timeout; {free:g} of {total:g} free now)"
        )
    return group


class RankActor:
    """One rank of a split replica, run inside a Ray actor (`start_ray_ranks` makes it remote)."""

    def run(self, spec: str) -> int:
        """Be the rank ``spec`` describes (`atlas_core.parallel.replica.worker_spec`) until rank 0 says stop;
        the worker entry's exit status."""
        from atlas_core.parallel.worker import main

        return main([spec])


class RayRanks(StartedRanks):
    """Ranks 1.. as Ray actors (rank order) in their placement group; ``runs`` are their `RankActor.run`
    calls. ``disconnect``: this replica connected to Ray (`connect_ray`) and disconnects when it stops."""

    def __init__(self, ray: ModuleType, group: Any, actors: list[Any], runs: list[Any], disconnect: bool) -> None:
        self.ray, self.group, self.actors, self.runs, self.disconnect = ray, group, actors, runs, disconnect

    def gone(self) -> str | None:
        ready, _ = self.ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for rank, run in enumerate(self.runs, start=1):
            if run in ready:
                try:
                    detail = f"it returned status {self.ray.get(run)}"
                except Exception as exc:  # the actor died, or the worker raised: Ray's error says which
                    lines = str(exc).strip().splitlines()
                    detail = lines[-1] if lines else type(exc).__name__
                return f"rank {rank}'s Ray actor ended before it joined: {detail}"
        return None

    def stop(self) -> None:
        _, running = self.ray.wait(self.runs, num_returns=len(self.runs), timeout=STOP_WAIT_S)
        if running:
            log.warning("%d rank actor(s) did not stop; killing them", len(running))
        self.kill()

    def kill(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            self.ray.kill(actor)
        remove_placement_group(self.group)
        if self.disconnect:
            self.ray.shutdown()
            self.disconnect = False


def rank0_address(ray: ModuleType, settings: ReplicaSettings) -> WorldAddress:
    """Where rank 0 listens for the actors: ``master_addr``, or this node's address in the cluster when that
    is a loopback address (which other nodes cannot reach); ``master_port``, else a free port."""
    host = ray.util.get_node_ip_address() if is_loopback(settings.master_addr) else settings.master_addr
    port = settings.port or free_port(host)
    return WorldAddress(0, settings.world, host, port, settings.comm_timeout)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address) is this host's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_ray_ranks(model: str | None, backend: Backend, settings: ReplicaSettings) -> tuple[RayRanks, WorldAddress]:
    """Connect to Ray, reserve a bundle per rank 1.. and start their actors; the actors and rank 0's address
    (they meet there as `atlas_core.parallel.replica.load_engine_model` joins). Device backends get a GPU per
    rank (Ray sets each actor's ``CUDA_VISIBLE_DEVICES``), host backends a CPU."""
    ray = import_ray()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    disconnect = connect_ray(ray, settings.ray_address)
    on_device = backend.device_memory() is not None
    count = settings.world - 1
    started = time.monotonic()
    try:
        group = reserve_bundles(ray, count, "GPU" if on_device else "CPU", settings.comm_timeout)
    except BaseException:
        if disconnect:
            ray.shutdown()
        raise
    ranks = RayRanks(ray, group, [], [], disconnect)
    try:
        address = rank0_address(ray, settings)
        remote = ray.remote(num_gpus=1, num_cpus=0) if on_device else ray.remote(num_cpus=1)
        actor_class = remote(RankActor)
        for rank in range(1, settings.world):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank - 1)
            actor = actor_class.options(scheduling_strategy=strategy).remote()
            ranks.actors.append(actor)
            ranks.runs.append(actor.run.remote(worker_spec(model, backend.name, settings, address, rank)))
    except BaseException:
        ranks.kill()
        raise
    log.info(
        "started ranks 1..%d as Ray actors (bundles ready in %.1f s); rank 0 listens at %s:%d",
        count,
        time.monotonic() - started,
        address.master_addr,
        address.master_port,
    )
    return ranks, address
