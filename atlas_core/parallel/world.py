"""A rank joins its replica: meet the other ranks, connect the comm backend, get its `TensorParallel`.

Every rank of a replica calls `join_world` with the same model, backend and parallel sizes; the
rendezvous refuses a rank whose Atlas version or settings differ from rank 0's before any weight is
read (`atlas_core.comm.rendezvous`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atlas_core.comm import CommBackend, CommError
from atlas_core.comm.rendezvous import Rendezvous, WorldAddress
from atlas_core.model.load import LoadedModel, load_model
from atlas_core.model.sharding import ShardPlan, TensorParallel
from atlas_core.parallel.settings import ReplicaSettings
from atlas_core.plugins import PluginRegistry
from atlas_core.version import __version__

POST_SPIN_S = 0.05
"""Ranks on a device backend poll for rank 0's next post this long after each one (`Rendezvous.share_posts`): a
decode step's post comes within it, and is seen at once rather than after a wake-up. Host backends wait on the
socket (their steps are long, and on a small machine a polling rank would take a core from rank 0)."""
IDENTITY_SETTINGS = ("max_seq_len", "gguf_weights", "load_format")
"""Load settings every rank must share (they shape the weights each rank holds)."""


@dataclass(frozen=True)
class World:
    """This rank's place in a joined replica: the rendezvous channel to the other ranks (rank 0 posts
    each step over it) and the shard plan with its communicator."""

    rendezvous: Rendezvous
    parallel: TensorParallel

    @property
    def rank(self) -> int:
        return self.rendezvous.rank

    def close(self) -> None:
        """Close the communicator and the rendezvous connections (peers then see this rank as gone)."""
        self.parallel.comm.close()
        self.rendezvous.close()


def comm_backend_name(settings: ReplicaSettings, backend: Any) -> str:
    """The comm backend ``settings`` name, else ``cpu`` for a host backend (no device memory) and ``nccl``
    for a device one."""
    if settings.comm_backend is not None:
        return settings.comm_backend
    return "cpu" if backend.device_memory() is None else "nccl"


def join_replica(
    model: str | None,
    backend: Any,
    registry: PluginRegistry,
    settings: ReplicaSettings,
    address: WorldAddress,
    gone: Callable[[], str | None] | None = None,
) -> World:
    """`join_world` for rank ``address.rank`` of the replica ``settings`` describe, serving ``model``: the
    model reference, the backend and `IDENTITY_SETTINGS` must be the same on every rank."""
    identity = {"model": None if model is None else str(model), "backend": backend.name}
    identity |= {name: getattr(settings, name) for name in IDENTITY_SETTINGS}
    comm = comm_backend_name(settings, backend)
    return join_world(address, settings.shard_plan(address.rank), registry, backend, comm, identity, gone)


def join_world(
    address: WorldAddress,
    plan: ShardPlan,
    registry: PluginRegistry,
    backend: Any,
    comm_backend: str,
    identity: dict[str, Any],
    gone: Callable[[], str | None] | None = None,
) -> World:
    """Meet the ranks of ``address`` (``identity``, the JSON settings every rank must share, is checked
    along with the Atlas version and the parallel sizes), then connect the registered ``comm_backend``.
    `CommError` when the ranks disagree, one does not come, or the plan's world size is not the address's."""
    if plan.world_size != address.world_size or plan.rank != address.rank:
        raise CommError(
            f"tensor_parallel_size={plan.tensor_parallel_size} and expert_parallel_size={plan.expert_parallel_size} "
            f"make a world of {plan.world_size} ranks, but this rank was started as rank {address.rank} of "
            f"{address.world_size}"
        )
    full_identity = identity | {
        "atlas_version": __version__,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "expert_parallel_size": plan.expert_parallel_size,
        "comm_backend": comm_backend,
    }
    comm_class = registry.load("comm", comm_backend)
    rendezvous = Rendezvous.meet(address, full_identity, gone)
    try:
        comm: CommBackend = comm_class.connect(rendezvous, backend)
        rendezvous.share_posts(0.0 if backend.device_memory() is None else POST_SPIN_S)
    except BaseException:
        rendezvous.close()
        raise
    return World(rendezvous, TensorParallel(plan, comm))


def load_shard(
    model: str | None, backend: Any, registry: PluginRegistry, settings: ReplicaSettings, world: World | None
) -> LoadedModel:
    """This rank's shard of ``model`` (`load_model` with the world's shard plan and communicator), or the whole
    model when ``world`` is None (one rank), loaded as ``settings`` say."""
    return load_model(
        model,
        backend,
        registry,
        max_positions=settings.max_positions,
        gguf_weights=settings.gguf_weights,
        parallel=None if world is None else world.parallel,
        load_format=settings.load_format,
    )
