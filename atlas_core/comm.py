"""The CommBackend contract and core's one-rank implementation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class CommBackend(ABC):
    """Collectives across the ranks of one model replica.

    Arrays are the active backend's arrays; operations are in place where the name says so
    and return the result otherwise. All ranks call every collective in the same order.
    """

    rank: int
    world_size: int

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
        """Send ``x`` to rank ``peer`` (blocks until matched by ``recv``)."""

    @abstractmethod
    def recv(self, x: Any, peer: int) -> Any:
        """Receive into ``x`` from rank ``peer``; returns ``x``."""


class SingleProcessComm(CommBackend):
    """World size 1: every collective is the identity; point-to-point has no peer."""

    rank = 0
    world_size = 1

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
