"""`StepWaits`: which bounded wait each replayed decode step of a split replica makes, and how a step queued ahead
takes its token ids."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from atlas_core.comm import SingleProcessComm
from atlas_core.parallel.mirror import StepWaits


class MarkingComm(SingleProcessComm):
    """A comm backend whose markers number the steps launched; records each wait (None: everything launched) and
    each broadcast."""

    def __init__(self) -> None:
        self.launched = 0
        self.waits: list[Any] = []
        self.events: list[str] = []

    def mark(self) -> Any:
        self.launched += 1
        return self.launched

    def wait(self, mark: Any = None) -> None:
        self.waits.append(mark)
        self.events.append(f"wait {mark}")

    def broadcast(self, x: Any, root: int = 0) -> Any:
        self.events.append("broadcast")
        return x

    def broadcast_queued(self, x: Any, root: int = 0) -> Any:
        self.events.append("broadcast queued")
        return x


def test_a_step_queued_ahead_waits_for_the_one_before_it_and_settle_for_itself() -> None:
    comm = MarkingComm()
    steps = StepWaits(comm)
    steps.replayed(False)  # built on the host: waits for itself
    assert comm.waits == [None]
    steps.replayed(True)  # the first queued ahead: the step before it was waited for already
    assert comm.waits == [None]
    steps.replayed(True)
    steps.replayed(True)
    assert comm.waits == [None, 1, 2]
    steps.settle()  # nothing queued after the third: its tokens are read after its own wait
    steps.settle()
    assert comm.waits == [None, 1, 2, 3]
    steps.replayed(True)
    steps.replayed(False)  # waits for everything, the step queued ahead included, which then needs no wait
    steps.settle()
    assert comm.waits == [None, 1, 2, 3, None]


def test_without_markers_every_step_waits_for_itself() -> None:
    waits: list[Any] = []
    comm = SingleProcessComm()
    comm.wait = lambda mark=None: waits.append(mark)  # type: ignore[method-assign]
    steps = StepWaits(comm)
    for queued_ahead in (False, True, True):
        steps.replayed(queued_ahead)
    steps.settle()
    assert waits == [None, None, None]


def test_replay_takes_the_ids_from_rank_0_queued_unless_the_replay_captures() -> None:
    """A step queued ahead takes its ids from a queued broadcast and waits for the step before it after the
    replay; one whose replay captures a graph (waiting for an idle device) first waits for everything launched,
    takes its ids from a broadcast that waits, and waits for itself. A step built on the host broadcasts nothing."""
    comm = MarkingComm()
    steps = StepWaits(comm)
    batch: Any = SimpleNamespace(input_ids=[0, 0])

    def run(replayed: Any) -> str:
        assert replayed is batch
        comm.events.append("run")
        return "logits"

    ahead = {"ids_from_rank_0": True, "captures": False}
    assert steps.replay(batch, ahead, run) == "logits"
    assert steps.replay(batch, ahead, run) == "logits"
    assert comm.events == ["broadcast queued", "run", "broadcast queued", "run", "wait 1"]
    comm.events.clear()
    steps.replay(batch, {"ids_from_rank_0": True, "captures": True}, run)
    assert comm.events == ["wait None", "broadcast", "run", "wait None"] and steps.unsettled is None
    comm.events.clear()
    steps.replay(batch, {"captures": False}, run)
    assert comm.events == ["run", "wait None"]
