"""`StateSlotPool`: per-sequence slots for recurrent layer state, handed out beside the KV blocks;
`StateSnapshots`: recurrent state saved at block boundaries, so hybrid models can reuse cached prefixes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence


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


class StateSnapshots:
    """Recurrent state at block boundaries of cached prefixes, in a bounded pool of state slots.

    A hybrid model (attention + recurrent layers) can reuse a cached KV prefix only together with the
    recurrent state after exactly that prefix. A snapshot is that state after the first ``k * block_size``
    tokens of a token sequence, filed under the block manager's content id of the prefix's k-th block
    (content ids name one exact token prefix and are never reused, see `BlockManager`). Snapshots occupy
    their own state slots (``slots``, disjoint from the sequences' slots), at most one per content id.
    When every slot is taken, `save` evicts a snapshot whose prefix has left the prefix cache
    (``is_cached(block_hash, content)`` false: it can never be hit again) or else the least recently
    used one. ``copy(sources, destinations)`` copies state slots (the model's `copy_state`).
    """

    def __init__(
        self, slots: Sequence[int], copy: Callable[[list[int], list[int]], None], is_cached: Callable[[int, int], bool]
    ) -> None:
        self._free = list(reversed(slots))
        self._copy = copy
        self._is_cached = is_cached
        self._held: OrderedDict[int, tuple[int, int]] = OrderedDict()  # content id -> (slot, block hash), LRU first

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, content: int) -> bool:
        return content in self._held

    def save(self, content: int, block_hash: int, source_slot: int) -> None:
        """Copy state slot ``source_slot`` into a snapshot for ``content`` (the content id of the block filed
        under ``block_hash``); a no-op when one exists (it becomes the most recently used) or the pool has
        no slots."""
        if content in self._held:
            self._held.move_to_end(content)
            return
        slot = self._take_slot()
        if slot is None:
            return
        self._copy([source_slot], [slot])
        self._held[content] = (slot, block_hash)

    def slot_of(self, content: int) -> int | None:
        """The state slot holding the snapshot of ``content``, None when there is none (it does not count as a
        use: the storage tiers copy it out when its block leaves the prefix cache)."""
        held = self._held.get(content)
        return None if held is None else held[0]

    def restore(self, content: int, destination_slot: int) -> None:
        """Copy the snapshot of ``content`` into state slot ``destination_slot``; KeyError when there is none."""
        slot, _ = self._held[content]
        self._copy([slot], [destination_slot])
        self._held.move_to_end(content)

    def discard(self, content: int) -> None:
        """Drop the snapshot of ``content`` (if any) and free its slot."""
        held = self._held.pop(content, None)
        if held is not None:
            self._free.append(held[0])

    def _take_slot(self) -> int | None:
        if self._free:
            return self._free.pop()
        if not self._held:
            return None
        stale = next((c for c, (_, h) in self._held.items() if not self._is_cached(h, c)), None)
        slot, _ = self._held.pop(stale if stale is not None else next(iter(self._held)))
        return slot
