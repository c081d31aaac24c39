"""`StepWaits`: which bounded wait each replayed decode step of a split replica makes."""

from __future__ import annotations

from typing import Any

from atlas_core.comm import SingleProcessComm
from atlas_core.parallel.mirror import StepWaits


class MarkingComm(SingleProcessComm):
    """A comm backend whose markers number the steps launched; records each wait (None: everything launched)."""

    def __init__(self) -> None:
        self.launched = 0
        self.waits: list[Any] = []

    def mark(self) -> Any:
        self.launched += 1
        return self.launched

    def wait(self, mark: Any = None) -> None:
        self.waits.append(mark)


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
