"""`Loads`: sequences whose KV (and recurrent state) is coming back from the storage tiers.

A load goes through two stages, neither of which blocks the engine thread:

1. **fetch**: the records are read from the tiers into host rows on the store's I/O thread
   (`TieredStore.get_async`);
2. **upload**: once they are in, the rows that passed their checks are written into the sequence's blocks (and
   state slot) through `HostTransfers.scatter` (on the CUDA backend: their own stream, overlapping the forward).

The sequence holds its blocks all along but is not scheduled until both stages are done (`is_loading`); then
`poll` reports how many of its tokens the load made computed. A load whose sequence is preempted or released
is cancelled: a started upload is fenced (later ops wait for it, so its blocks can be reused at once).

On a split replica (``mirror``, a `LoadMirror`) every rank fetches its own shard of the records: rank 0 posts each
load as it starts (and each cancel), and a load is *settled* only when every rank has fetched it: `LoadMirror.agree`
(one collective in a poll where rank 0 holds a fetched, unsettled load) sums the ranks' `Load.flags`, so a record
lost or mismatched on any rank is bad on all of them and every rank uploads the same leading records.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Hashable
from collections.abc import Sequence as Seq
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.transfers import HostTransfers, Transfer
from atlas_core.storage.tiered import Key

UPLOAD_POLL_S = 0.001
"""How often `Loads.wait` looks at uploads in flight (they have no future to wait on)."""


log = logging.getLogger("atlas.storage")


@dataclass(eq=False)
class Load:
    """One sequence's records on their way back.

    ``seq`` is whom the load is for (a `Sequence` on rank 0; the load's id on the other ranks of a split
    replica). ``blocks[i]`` receives record ``keys[i]`` (KV rows ``rows``, whose last entry is the records' check
    array);
    ``expected[i]``, when given, is what that check array must hold (prefix loads: parent hash and token ids),
    and the load keeps the leading records that pass; without it (swap) any lost record voids the load. With
    ``state`` (``(slot, rows, fetch)``) the records only count together with that recurrent state, which is
    written into the slot. ``on_done(load)`` runs when it is over: `good` leading records were loaded (0:
    none), `bad` lists the keys that were lost or failed their check."""

    seq: Hashable
    blocks: list[int]
    rows: list[np.ndarray]
    fetch: Future[list[Any]]
    keys: list[Any]
    on_done: Callable[[Load], None]
    expected: list[np.ndarray] | None = None
    state: tuple[int, list[np.ndarray], Future[list[Any]]] | None = None
    good: int = 0
    bad: list[Key] = field(default_factory=list)
    uploads: list[Transfer] = field(default_factory=list)
    id: int = 0
    settled: bool = False

    @property
    def fetched(self) -> bool:
        return self.fetch.done() and (self.state is None or self.state[2].done())

    def flags(self) -> list[int]:
        """After the fetch: one flag per record (1: lost, or failing its check), then one for the state (1: lost).
        A fetch that raised (an unexpected error of a tier's I/O) loses all it was to bring back, logged once per
        load: the blocks are recomputed, and on a split replica every rank still takes part in the agreement."""
        try:
            lost = set(self.fetch.result())
        except Exception:
            log.exception("reading KV records back from a storage tier failed; they are recomputed")
            lost = set(self.keys)
        flags = [
            int(
                key in lost
                or (self.expected is not None and not np.array_equal(self.rows[-1][row], self.expected[row]))
            )
            for row, key in enumerate(self.keys)
        ]
        return [*flags, int(self.state is not None and self._state_lost())]

    def _state_lost(self) -> bool:
        assert self.state is not None
        try:
            return bool(self.state[2].result())
        except Exception:
            log.exception("reading a recurrent state back from a storage tier failed; it is recomputed")
            return True

    def settle(self, flags: Seq[int]) -> None:
        """Set `good` (how many leading records count) and `bad` (the keys lost or failing their check) from
        `flags` (this rank's, or every rank's summed)."""
        self.bad = [key for key, flag in zip(self.keys, flags, strict=False) if flag]
        first_bad = self.keys.index(self.bad[0]) if self.bad else len(self.keys)
        partial = self.expected is not None and self.state is None  # a dense prefix keeps its intact head
        self.good = 0 if flags[-1] or (first_bad < len(self.keys) and not partial) else first_bad
        self.settled = True


class LoadMirror(Protocol):
    """Rank 0's link to the other ranks' loads (`atlas_core.parallel.tier_mirror.TierMirror`)."""

    def started(self, load: Load) -> None:
        """``load`` (its `Load.id` set) started here: every other rank starts fetching its shard."""

    def cancelled(self, load: Load) -> None:
        """``load`` was cancelled here."""

    def agree(self, loads: list[Load]) -> None:
        """Settle (`Load.settle`) those of ``loads`` that every rank has fetched, from every rank's flags."""

    def closed(self) -> None:
        """The tiers were closed here (their last journal entries go out now)."""


class Loads:
    """The loads in flight, by sequence (engine thread only)."""

    def __init__(
        self,
        transfers: HostTransfers,
        kv_arrays: list[Array],
        state_arrays: list[Array],
        mirror: LoadMirror | None = None,
    ) -> None:
        self.transfers = transfers
        self.kv_arrays, self.state_arrays = kv_arrays, state_arrays
        self.mirror = mirror
        self._ids = itertools.count()
        self._loads: dict[Hashable, Load] = {}
        self._fenced: list[Transfer] = []  # uploads of cancelled loads, kept until done

    def __len__(self) -> int:
        return len(self._loads)

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._loads

    def start(self, load: Load) -> None:
        load.id = next(self._ids)
        self._loads[load.seq] = load
        if self.mirror is not None:
            self.mirror.started(load)

    def poll(self) -> None:
        """Advance every load: settle fetched ones and start their uploads, finish those whose uploads are done
        (their ``on_done`` runs here)."""
        self._fenced = [transfer for transfer in self._fenced if not transfer.done()]
        unsettled = [load for load in self._loads.values() if not load.settled]
        if self.mirror is not None and any(load.fetched for load in unsettled):
            self.mirror.agree(unsettled)
        elif self.mirror is None:
            for load in unsettled:
                if load.fetched:
                    load.settle(load.flags())
        for seq, load in list(self._loads.items()):
            if not load.settled:
                continue
            if load.good and not load.uploads:
                load.uploads = upload(self.transfers, self.kv_arrays, self.state_arrays, load)
            if all(transfer.done() for transfer in load.uploads):
                del self._loads[seq]
                load.on_done(load)

    def cancel(self, seq: Hashable) -> bool:
        """Forget ``seq``'s load (its records stay where they are); False when it had none."""
        load = self._loads.pop(seq, None)
        if load is None:
            return False
        if self.mirror is not None:
            self.mirror.cancelled(load)
        for transfer in load.uploads:
            transfer.fence()
            self._fenced.append(transfer)
        return True

    def wait(self, timeout: float) -> None:
        """Block until some load may have moved on (a fetch completed), at most ``timeout`` seconds."""
        fetches = [f for load in self._loads.values() if not load.settled for f in _futures(load) if not f.done()]
        if fetches:
            wait(fetches, timeout=timeout, return_when=FIRST_COMPLETED)
        elif self._loads:
            time.sleep(min(timeout, UPLOAD_POLL_S))


def upload(transfers: HostTransfers, kv_arrays: list[Array], state_arrays: list[Array], load: Load) -> list[Transfer]:
    """Start writing a settled ``load``'s `Load.good` leading records into its blocks (and its state into its
    slot); the transfers."""
    good = load.good
    uploads = [transfers.scatter(kv_arrays, load.blocks[:good], [r[:good] for r in load.rows[:-1]])]
    if load.state is not None:
        slot, rows, _ = load.state
        uploads.append(transfers.scatter(state_arrays, [slot], rows))
    return uploads


def _futures(load: Load) -> list[Future[list[Any]]]:
    return [load.fetch] if load.state is None else [load.fetch, load.state[2]]
