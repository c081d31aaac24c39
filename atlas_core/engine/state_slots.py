"""`StateSlotPool`: per-sequence slots for recurrent layer state, handed out beside the KV blocks."""

from __future__ import annotations

from collections.abc import Callable


class StateSlotPool:
    """Per-sequence slots for recurrent layer state (Mamba-2 conv/SSM state, gated-delta-net state), beside
    the KV blocks. A slot is exclusively owned from `allocate` until `free`; ``reset(slot)`` is called on
    every allocation so the caller can zero the slot's state before a new sequence uses it.
    """

    def __init__(self, num_slots: int, reset: Callable[[int], None] | None = None) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self._reset = reset
        self._free = list(range(num_slots - 1, -1, -1))  # a stack: slot 0 is handed out first
        self._in_use = [False] * num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        """A free slot, after ``reset(slot)``; None when none is free. If ``reset`` raises, the slot stays free."""
        if not self._free:
            return None
        slot = self._free[-1]
        if self._reset is not None:
            self._reset(slot)
        self._free.pop()
        self._in_use[slot] = True
        return slot

    def free(self, slot: int) -> None:
        """Return an allocated slot; raises ValueError for an unknown or already free slot."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"unknown state slot {slot} (the pool has {self.num_slots})")
        if not self._in_use[slot]:
            raise ValueError(f"state slot {slot} is not allocated (double free?)")
        self._in_use[slot] = False
        self._free.append(slot)
