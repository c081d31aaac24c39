"""The CommBackend contract and core's one-rank implementation.

A backend is built for one rank by ``cls.connect(rendezvous, backend)``: ``rendezvous`` is the
`atlas_core.comm.rendezvous.Rendezvous` every rank of the replica has met at (rank, world size,
a small all-to-all exchange of JSON values for addresses or NCCL ids); ``backend`` is the array
backend whose arrays the collectives take. Core ships ``single`` (world size 1) and ``cpu`` (one
process per rank over TCP, `atlas_core.comm.cpu`); ``nccl`` comes from atlas-comm-nccl.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from atlas_core.errors import AtlasError

if TYPE_CHECKING:
    from atlas_core.comm.rendezvous import Rendezvous


class CommError(AtlasError):
    """A collective or a peer failed: a rank died, timed out, or called a different collective."""


class CommBackend(ABC):
    """Collectives across the ranks of one model replica.

    Arrays are the active backend's arrays; operations are in place where the name says so
    and return the result otherwise. All ranks call every collective in the same order, and every
    rank gets bitwise the same result from ``all_reduce`` (ranks must stay in lockstep on it).
    Failures raise `CommError`.
    """

    rank: int
    world_size: int

    @classmethod
    @abstractmethod
    def connect(cls, rendezvous: Rendezvous, backend: Any) -> CommBackend:
        """This rank's communicator, set up with the peers that met at ``rendezvous``."""

    @abstractmethod
    def all_reduce(self, x: Any) -> Any:
        """Sum ``x`` over ranks, in place; returns ``x``."""

    @abstractmethod
    def all_gather(self, x: Any, axis: int = 0) -> Any:
        """Concatenate every rank's ``x`` along ``axis`` (rank order)."""

    @abstractmethod
    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Overwrite ``x`` on every rank with root's ``x``, in place; returns ``x``."""

    @abstractmethod
    def send(self, x: Any, peer: int) -> None:
        """Send ``x`` to rank ``peer`` (matched by that rank's ``recv``)."""

    @abstractmethod
    def recv(self, x: Any, peer: int) -> Any:
        """Receive into ``x`` from rank ``peer``; returns ``x``."""

    def broadcast_queued(self, x: Any, root: int = 0) -> Any:
        """`broadcast`, queued behind the work already launched on this rank's device without waiting for it to
        finish (a later `wait` bounds it); returns ``x``. Default: `broadcast`, for backends whose collectives
        finish before they return."""
        return self.broadcast(x, root)

    def mark(self) -> Any:
        """A marker of the work this rank has launched so far, which `wait` takes to wait for that work alone;
        None (the default) where collectives finish before they return."""
        return None

    def wait(self, mark: Any = None) -> None:  # noqa: B027 (optional: backends whose collectives finish at once)
        """Block until every collective this rank has launched has finished (with ``mark`` from `mark`: those
        launched before it was taken), within the backend's timeout (`CommError` past it). Backends that return
        before a collective finishes (launched on a device stream, or replayed in a captured graph) make this
        the bounded wait that a dead peer cannot hang."""

    def close(self) -> None:  # noqa: B027 (optional: backends without connections keep this no-op)
        """Release connections and buffers; the communicator is unusable afterwards."""


class SingleProcessComm(CommBackend):
    """World size 1: every collective is the identity; point-to-point has no peer."""

    rank = 0
    world_size = 1

    @classmethod
    def connect(cls, rendezvous: Rendezvous, backend: Any) -> SingleProcessComm:
        if rendezvous.world_size != 1:
            raise CommError(
                f"the 'single' comm backend runs one rank, not {rendezvous.world_size}; choose a multi-rank "
                "backend with --comm-backend (cpu, or nccl from atlas-comm-nccl)"
            )
        return cls()

    def all_reduce(self, x: Any) -> Any:
        return x

    def all_gather(self, x: Any, axis: int = 0) -> Any:
        return x

    def broadcast(self, x: Any, root: int = 0) -> Any:
        if root != 0:
            raise ValueError(f"root {root} does not exist in a world of size 1")
        return x

    def send(self, x: Any, peer: int) -> None:
        raise ValueError(f"rank {peer} does not exist in a world of size 1")

    def recv(self, x: Any, peer: int) -> Any:
        raise ValueError(f"rank {peer} does not exist in a world of size 1")
