"""`Loads`: sequences whose KV (and recurrent state) is coming back from the storage tiers.

A load goes through two stages, neither of which blocks the engine thread:

1. **fetch**: the records are read from the tiers into host rows on the store's I/O thread
   (`TieredStore.get_async`);
2. **upload**: once they are in, the rows that passed their checks are written into the sequence's blocks (and
   state slot) through `HostTransfers.scatter` (on the CUDA backend: their own stream, overlapping the forward).

The sequence holds its blocks all along but is not scheduled until both stages are done (`is_loading`); then
`poll` reports how many of its tokens the load made computed. A load whose sequence is preempted or released
is cancelled: a started upload is fenced (later ops wait for it, so its blocks can be reused at once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.transfers import HostTransfers, Transfer
from atlas_core.engine.sequence import Sequence
from atlas_core.storage.tiered import Key

UPLOAD_POLL_S = 0.001
"""How often `Loads.wait` looks at uploads in flight (they have no future to wait on)."""


@dataclass(eq=False)
class Load:
    """One sequence's records on their way back.

    ``blocks[i]`` receives record ``keys[i]`` (KV rows ``rows``, whose last entry is the records' check array);
    ``expected[i]``, when given, is what that check array must hold (prefix loads: parent hash and token ids),
    and the load keeps the leading records that pass; without it (swap) any lost record voids the load. With
    ``state`` (``(slot, rows, fetch)``) the records only count together with that recurrent state, which is
    written into the slot. ``on_done(load)`` runs when it is over: `good` leading records were loaded (0:
    none), `bad` lists the keys that were lost or failed their check."""

    seq: Sequence
    blocks: list[int]
    rows: list[np.ndarray]
    fetch: Future[list[Key]]
    keys: list[Key]
    on_done: Callable[[Load], None]
    expected: list[np.ndarray] | None = None
    state: tuple[int, list[np.ndarray], Future[list[Key]]] | None = None
    good: int = 0
    bad: list[Key] = field(default_factory=list)
    uploads: list[Transfer] = field(default_factory=list)

    @property
    def fetched(self) -> bool:
        return self.fetch.done() and (self.state is None or self.state[2].done())

    def check(self) -> None:
        """After the fetch: set `good` (how many leading records arrived intact and count) and `bad` (the keys
        that were lost or failed their check)."""
        lost = set(self.fetch.result())
        state_lost = self.state is not None and bool(self.state[2].result())
        self.bad = [
            key
            for row, key in enumerate(self.keys)
            if key in lost or (self.expected is not None and not np.array_equal(self.rows[-1][row], self.expected[row]))
        ]
        first_bad = self.keys.index(self.bad[0]) if self.bad else len(self.keys)
        partial = self.expected is not None and self.state is None  # a dense prefix keeps its intact head
        self.good = 0 if state_lost or (first_bad < len(self.keys) and not partial) else first_bad


class Loads:
    """The loads in flight, by sequence (engine thread only)."""

    def __init__(self, transfers: HostTransfers, kv_arrays: list[Array], state_arrays: list[Array]) -> None:
        self.transfers = transfers
        self.kv_arrays, self.state_arrays = kv_arrays, state_arrays
        self._loads: dict[Sequence, Load] = {}
        self._fenced: list[Transfer] = []  # uploads of cancelled loads, kept until done

    def __len__(self) -> int:
        return len(self._loads)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self._loads

    def start(self, load: Load) -> None:
        self._loads[load.seq] = load

    def poll(self) -> None:
        """Advance every load: start the uploads of fetched ones, finish those whose uploads are done (their
        ``on_done`` runs here)."""
        self._fenced = [transfer for transfer in self._fenced if not transfer.done()]
        for seq, load in list(self._loads.items()):
            if not load.uploads:
                if not load.fetched:
                    continue
                load.check()
                if load.good:
                    self._upload(load)
            if all(transfer.done() for transfer in load.uploads):
                del self._loads[seq]
                load.on_done(load)

    def cancel(self, seq: Sequence) -> bool:
        """Forget ``seq``'s load (its records stay where they are); False when it had none."""
        load = self._loads.pop(seq, None)
        if load is None:
            return False
        for transfer in load.uploads:
            transfer.fence()
            self._fenced.append(transfer)
        return True

    def wait(self, timeout: float) -> None:
        """Block until some load may have moved on (a fetch completed), at most ``timeout`` seconds."""
        fetches = [f for load in self._loads.values() if not load.uploads for f in _futures(load) if not f.done()]
        if fetches:
            wait(fetches, timeout=timeout, return_when=FIRST_COMPLETED)
        elif self._loads:
            time.sleep(min(timeout, UPLOAD_POLL_S))

    def _upload(self, load: Load) -> None:
        good = load.good
        load.uploads.append(
            self.transfers.scatter(self.kv_arrays, load.blocks[:good], [r[:good] for r in load.rows[:-1]])
        )
        if load.state is not None:
            slot, rows, _ = load.state
            load.uploads.append(self.transfers.scatter(self.state_arrays, [slot], rows))


def _futures(load: Load) -> list[Future[list[Key]]]:
    return [load.fetch] if load.state is None else [load.fetch, load.state[2]]
