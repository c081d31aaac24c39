"""A rank other than 0 of a split replica: its own KV storage tiers, run as rank 0's journal says.

`TierFollower` is built by the ``tiers`` instruction (rank 0 built its tiers: this rank opens the same ones,
with the same slot counts, for its shard of the records; NVMe under ``kv_spill_dir/rank-N``), then runs each
``tier`` instruction's operations in order (`atlas_core.parallel.tier_mirror`): ``put`` gathers this rank's
blocks (or state slots) now, at the same point of the step sequence as rank 0 did, and writes them where rank 0
wrote its own; ``get`` starts a fetch, which the next ``load`` takes (with the blocks and state slot it fills);
``cancel`` forgets a load; ``drop`` and ``demote`` follow rank 0's; ``close`` closes a store's tiers. Each
``loads`` instruction settles the listed loads with rank 0 (`agree_loads`); a settled load's upload is fenced at
once, so this rank's next ops see it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.backends.base import Backend
from atlas_core.batch.kv_cache import KVCache
from atlas_core.kvtiers.agree import agree_loads, rank_capacity, reconcile
from atlas_core.kvtiers.loads import Load, upload
from atlas_core.kvtiers.place import TierPlace, kv_record_format, open_tier, state_record_format
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.sharding import TensorParallel
from atlas_core.storage.replay import TierReplay


class TierFollower:
    """This rank's tiers (one `TierReplay` per store) and its loads in flight, by id."""

    def __init__(
        self,
        parallel: TensorParallel,
        backend: Backend,
        kv: KVCache,
        state: RecurrentState | None,
        spec: dict[str, Any],
    ) -> None:
        self.parallel, self.backend, self.kv, self.state = parallel, backend, kv, state
        self.transfers = backend.host_transfers()
        plan = parallel.plan
        directory = Path(spec["spill_dir"]) if spec["spill_dir"] is not None else None
        place = TierPlace(
            directory,
            spec["model"],
            bool(spec["persist"]),
            (plan.rank, plan.tensor_parallel_size, plan.expert_parallel_size),
            tuple(kv.scales),
        )
        self.replays: dict[str, TierReplay] = {}
        slots: list[int] = []
        for part, store in spec["stores"].items():
            fmt = kv_record_format(kv) if part == "kv" else state_record_format(self._state())
            tiers = [
                open_tier(fmt, name, rank_capacity(size, store["nbytes"], fmt.nbytes), place, part)
                for name, size, _ in store["tiers"]
            ]
            self.replays[part] = TierReplay(fmt, tiers)
            slots += [count for *_, count in store["tiers"]]
        if place.persist:
            reconcile(parallel, backend, [t for replay in self.replays.values() for t in replay.tiers], slots)
        self._fetches: dict[str, tuple[list[np.ndarray], Future[list[int]]]] = {}
        self._loads: dict[int, Load] = {}

    def run(self, ops: list[dict[str, Any]]) -> None:
        """Run one ``tier`` instruction's operations, in order."""
        for op in ops:
            do = op["do"]
            if do == "load":
                self._start(op)
            elif do == "cancel":
                self._loads.pop(int(op["id"]), None)
            elif do == "put":
                self.replays[op["store"]].put(op["moves"], op["placed"], self._records(op["source"]))
            elif do == "get":
                self._fetches[op["store"]] = self.replays[op["store"]].get(op["reads"], int(op["count"]))
            elif do == "drop":
                self.replays[op["store"]].drop(op["slots"])
            elif do == "demote":
                self.replays[op["store"]].demote(op["moves"])
            elif do == "close":
                self.replays.pop(op["store"]).close()
            else:
                raise ValueError(f"unknown storage-tier operation {do!r}")

    def poll(self, ids: list[int]) -> None:
        """Settle the loads ``ids`` with rank 0 (in its order); upload the settled ones and fence them."""
        loads = [self._loads[int(i)] for i in ids]
        agree_loads(self.parallel, self.backend, loads)
        for load in loads:
            if not load.settled:
                continue
            del self._loads[load.seq]  # type: ignore[arg-type]  # the id, on this rank
            if load.good:
                for transfer in upload(self.transfers, self.kv.arrays, self._state_arrays(), load):
                    transfer.fence()

    def close(self) -> None:
        """Close the tiers rank 0 did not close (it stopped without closing its engine). Idempotent."""
        for replay in self.replays.values():
            replay.close()
        self.replays.clear()

    def _start(self, op: dict[str, Any]) -> None:
        rows, fetch = self._fetches.pop("kv")
        state = None
        if op["state"] is not None:
            state = (int(op["state"]), *self._fetches.pop("state"))
        expected = None if op["expected"] is None else [np.asarray(row, np.int64) for row in op["expected"]]
        keys = list(range(len(rows[0])))
        self._loads[int(op["id"])] = Load(
            int(op["id"]), list(op["blocks"]), rows, fetch, keys, _nothing, expected, state
        )

    def _records(self, source: dict[str, Any]) -> Callable[[], list[np.ndarray]]:
        """Start gathering this rank's shard of a ``put``'s records; the wait that gives them."""
        rows = [int(row) for row in source["rows"]]
        if source["kind"] == "state":
            return self.transfers.gather(self._state_arrays(), rows)
        gathered = self.transfers.gather(self.kv.arrays, rows)
        meta = source["meta"]
        checks = (
            np.asarray(meta, np.int64) if meta is not None else np.zeros((len(rows), self.kv.block_size + 1), np.int64)
        )
        return lambda: [*gathered(), checks]

    def _state(self) -> RecurrentState:
        if self.state is None:
            raise ValueError("rank 0 posted recurrent-state tiers for a model without recurrent state")
        return self.state

    def _state_arrays(self) -> list[Any]:
        return self.state.slot_arrays() if self.state is not None else []


def _nothing(load: Load) -> None:
    """A load's end on a rank other than 0: nothing to report (rank 0 updates its sequence)."""
