"""``example-recording``: a one-rank comm backend that records each collective it is asked for."""

from __future__ import annotations

from typing import Any

from atlas_core.comm import SingleProcessComm


class RecordingComm(SingleProcessComm):
    """`SingleProcessComm` semantics (world size 1); ``calls`` lists the operations in call order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def all_reduce(self, x: Any) -> Any:
        self.calls.append("all_reduce")
        return super().all_reduce(x)

    def all_gather(self, x: Any, axis: int = 0) -> Any:
        self.calls.append("all_gather")
        return super().all_gather(x, axis)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        self.calls.append("broadcast")
        return super().broadcast(x, root)

    def send(self, x: Any, peer: int) -> None:
        self.calls.append("send")
        super().send(x, peer)

    def recv(self, x: Any, peer: int) -> Any:
        self.calls.append("recv")
        return super().recv(x, peer)
