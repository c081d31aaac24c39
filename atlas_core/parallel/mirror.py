"""Rank 0 tells the other ranks of a split replica what to run, step by step.

Rank 0 owns the scheduler, the tokenizer and the server; its model and KV cache carry a `RankMirror`
that posts every call the engine makes on them to the other ranks before running it itself: the KV
cache's size (once), copy-on-write block copies, recurrent-state slot calls (hybrid models), each
forward's `ForwardBatch` (`atlas_core.parallel.batch_wire`: with its image features and M-RoPE rows,
which rank 0 alone computes), and each ``compute_logits`` (whose hidden rows are broadcast from rank 0, so
every rank projects the same rows). With MTP speculation, the MTP head is built on every rank (posted
once, before the KV cache) and its forwards and logits calls are posted like the model's. With KV storage
tiers, their operations (`atlas_core.parallel.tier_mirror`) are queued in ``tier_ops`` and posted as one
``tier`` instruction ahead of whatever is posted next.
Steps that a backend's captured decode graphs serve (`MirroredGraphs`) are posted whole, as one ``graph``
instruction: every rank then replays (or, the first time, captures in step with the others) its own graph
of the same bucket, whose collectives pair up with the other ranks' graphs, and every rank projects its own
final hidden rows (the all-reduced stream is the same on every rank); while rank 0 runs its graph, the
model's calls are not posted (`unposted`).
A decode step queued ahead (`atlas_core.engine.ahead`) runs on the tokens the step before it sampled, which
exist on rank 0's device only: its message carries zeros for them, and every rank takes them from rank 0's
broadcast, queued behind the step before (`atlas_core.parallel.batch_wire.ids_from_rank_0`). Such a step's
graph replay waits for the step before it rather than for itself (`StepWaits`), so that every rank queues
it while the device still runs that one.
The other ranks (`atlas_core.parallel.worker`) run the same calls on their shards in the same order,
so their collectives pair up with rank 0's.

A failure of the replica (a rank gone, a collective timed out) is a `CommError`: the mirror records
the first one, hands it to the callbacks registered with `on_failure` (the server stops on it), and
raises it for every later call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import AnyKVLayout, KVCache, KVPlan, layout_scales
from atlas_core.comm import CommBackend, CommError
from atlas_core.model.sharding import TensorParallel
from atlas_core.parallel.batch_wire import encode_batch, ids_from_rank_0

if TYPE_CHECKING:
    from atlas_core.parallel.world import World

log = logging.getLogger("atlas.parallel")

T = TypeVar("T")


class StepWaits:
    """The bounded waits (`CommBackend.wait`) of the decode-graph steps a rank replays. A step built on the host
    waits for itself. A step queued ahead waits for the step before it, and leaves its own wait to the next step
    queued ahead or to `settle`; with a comm backend that gives no markers (`CommBackend.mark`), it waits for
    itself too. A step queued ahead whose replay captures a graph first (which waits for the device to be idle,
    unbounded) waits for every earlier step before it, and for itself."""

    def __init__(self, comm: CommBackend) -> None:
        self.comm = comm
        self.unsettled: Any = None
        """The marker of the last step queued ahead, not waited for yet."""

    def replay(self, batch: ForwardBatch, header: dict[str, Any], run: Callable[[ForwardBatch], T]) -> T:
        """``run(batch)``: the replay of posted ``batch`` (``header``: its message's), with the step's token ids
        taken from rank 0's broadcast when they are on its device only, and the step's wait after it."""
        queued_ahead, capturing = ids_from_rank_0(header), bool(header.get("captures", True))
        if queued_ahead and capturing:
            self._wait_for_all()
            self.comm.broadcast(batch.input_ids, root=0)
        elif queued_ahead:
            self.comm.broadcast_queued(batch.input_ids, root=0)
        result = run(batch)
        self.replayed(queued_ahead and not capturing)
        return result

    def replayed(self, queued_ahead: bool) -> None:
        """After a step's graph was launched: its wait, or that of the step queued ahead before it."""
        mark = self.comm.mark() if queued_ahead else None
        if mark is None:
            self._wait_for_all()
            return
        previous, self.unsettled = self.unsettled, mark
        if previous is not None:
            self.comm.wait(previous)

    def _wait_for_all(self) -> None:
        """Wait for everything this rank launched, the last step queued ahead included."""
        self.comm.wait()
        self.unsettled = None

    def settle(self) -> None:
        """Wait for the last step queued ahead, if it was not waited for: before its tokens are read when no step
        was queued after it."""
        mark, self.unsettled = self.unsettled, None
        if mark is not None:
            self.comm.wait(mark)


class RankMirror:
    """Rank 0's end of a split replica: posts each model and KV-cache call to the other ranks."""

    def __init__(self, world: World, backend: Backend, close: Callable[[], None]) -> None:
        """``close``: stops the other ranks (`atlas_core.parallel.replica.Replica.close`)."""
        self.world, self.backend = world, backend
        self.close = close
        self.failure: CommError | None = None
        self.tier_ops: list[dict[str, Any]] = []  # storage-tier operations not posted yet
        self._callbacks: list[Callable[[CommError], None]] = []
        self._lock = threading.Lock()
        self._posting = True
        self.steps = StepWaits(world.parallel.comm)

    @contextlib.contextmanager
    def unposted(self) -> Iterator[None]:
        """Within: the model's forward and logits calls run on rank 0 alone (the other ranks run their own
        part of the same step from one posted instruction: a graph replay)."""
        self._posting = False
        try:
            yield
        finally:
            self._posting = True

    def kv_cache(
        self, layouts: list[AnyKVLayout], plan: KVPlan, kv_cache_dtype: str, high_precision: list[str]
    ) -> KVCache:
        """Rank 0's KV cache; every other rank allocates one of the same blocks, ``kv_cache_dtype``, high-precision
        layers and per-layer scales (over its own heads)."""
        header = {"op": "kv", "num_blocks": plan.num_blocks, "block_size": plan.block_size}
        settings = {"kv_cache_dtype": kv_cache_dtype, "kv_high_precision_layers": high_precision}
        self.post(header | settings | {"kv_scales": layout_scales(layouts)})
        return MirroredKVCache(self, layouts, plan)

    def load_mtp(self, max_seq_len: int) -> TensorParallel:
        """Tell the other ranks to build their shard of the checkpoint's MTP head (position tables
        ``max_seq_len`` long), which adds its KV layers to the cache `kv_cache` then allocates; rank 0's
        shard plan and communicator, to build its own shard with."""
        self.post({"op": "mtp", "max_seq_len": max_seq_len})
        return self.world.parallel

    def forward(self, batch: ForwardBatch, run: Callable[[], T], mtp_step: int | None = None) -> T:
        """Post ``batch``, then ``run()`` rank 0's forward (a collective failure is the replica's failure).
        ``mtp_step``: the batch is for the MTP head's chained step ``mtp_step`` (None: the model's own)."""
        if not self._posting:
            return run()
        header, arrays = encode_batch(self.backend, batch)
        self.post({"op": "forward", "mtp_step": mtp_step} | header, arrays)
        if ids_from_rank_0(header):
            self.guard(lambda: self.world.parallel.comm.broadcast(batch.input_ids, root=0))
        return self.guard(run)

    def settle(self) -> None:
        """Wait, bounded by the comm timeout, for the last decode step queued ahead when no step was queued after
        it (`StepWaits.settle`): before its tokens are read. On a replica that failed the wait still runs (past the
        timeout it aborts the communicator, so that nothing is left queued behind a dead rank), then the failure
        is raised."""
        try:
            self.steps.settle()
        except CommError as exc:
            self.fail(exc)
            raise
        if self.failure is not None:
            raise self.failure

    def logits(self, hidden: Array, run: Callable[[Array], T], mtp_step: int | None = None) -> T:
        """Post a logits call and broadcast rank 0's ``hidden`` rows, then ``run(hidden)``. ``mtp_step``: the
        rows go through the LM head of the MTP head's chained step ``mtp_step`` (None: the model's)."""
        if not self._posting:
            return run(hidden)
        header = {"op": "logits", "shape": list(hidden.shape), "dtype": np.dtype(hidden.dtype).name}
        self.post(header | {"mtp_step": mtp_step})
        return self.guard(lambda: run(self.world.parallel.comm.broadcast(hidden, root=0)))

    def state(self, call: str, *args: Any) -> None:
        """Post recurrent-state call ``call`` (``allocate_state``, ``reset_state``, ``copy_state``) with ``args``
        (slot numbers, or sequences of them)."""
        values = [[int(v) for v in a] if isinstance(a, (list, tuple)) else int(a) for a in args]
        self.post({"op": "state", "call": call, "args": values})

    def post(self, header: dict[str, Any], arrays: list[np.ndarray] | None = None) -> None:
        """Send one instruction to every other rank (after the queued ``tier_ops``); the replica's failure when it
        has failed."""
        self.flush()
        self.guard(lambda: self.world.rendezvous.post(header, arrays or []))

    def flush(self) -> None:
        """Post the queued storage-tier operations (if any) as one ``tier`` instruction."""
        if self.tier_ops:
            ops, self.tier_ops = self.tier_ops, []
            self.guard(lambda: self.world.rendezvous.post({"op": "tier", "ops": ops}, []))

    def guard(self, run: Callable[[], T]) -> T:
        """``run()``; a `CommError` it raises fails the replica (`fail`) and is raised."""
        if self.failure is not None:
            raise self.failure
        try:
            return run()
        except CommError as exc:
            self.fail(exc)
            raise

    def on_failure(self, callback: Callable[[CommError], None]) -> None:
        """Call ``callback(error)`` when the replica fails (at once if it already has)."""
        with self._lock:
            self._callbacks.append(callback)
            failure = self.failure
        if failure is not None:
            callback(failure)

    def fail(self, error: CommError) -> None:
        """Record the replica's first failure and tell the callbacks (later failures are its echoes)."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = error
            callbacks = list(self._callbacks)
        log.error("the replica failed: %s", error)
        for callback in callbacks:
            callback(error)


class MirroredKVCache(KVCache):
    """Rank 0's KV cache: block copies are posted to the other ranks before they are made here."""

    def __init__(self, mirror: RankMirror, layouts: list[AnyKVLayout], plan: KVPlan) -> None:
        super().__init__(mirror.backend, layouts, plan)
        self.mirror = mirror

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        self.mirror.post({"op": "copy_blocks"}, [np.asarray(copies, dtype=np.int64).reshape(-1, 2)])
        super().copy_blocks(copies)


class MirroredGraphs:
    """Rank 0's decode graphs of a split model (`atlas_core.engine.decode_graphs.DecodeGraphs`): each step they serve
    is posted as one ``graph`` instruction, then replayed here with the model's calls unposted; every rank
    then waits for the step's collectives, or those of the step before it for a step queued ahead (`StepWaits`,
    bounded by the comm timeout)."""

    def __init__(self, mirror: RankMirror, graphs: Any) -> None:
        self.mirror, self.graphs = mirror, graphs

    @property
    def last_hidden(self) -> Array | None:
        return self.graphs.last_hidden

    def can_run(self, batch: ForwardBatch) -> bool:
        return bool(self.graphs.can_run(batch))

    def close(self) -> None:
        self.graphs.close()

    def run(self, batch: ForwardBatch) -> Array:
        header, arrays = encode_batch(self.mirror.backend, batch)
        if ids_from_rank_0(header):  # a step queued ahead: every rank follows rank 0 on whether it captures
            captures = getattr(self.graphs, "captures", None)
            header["captures"] = True if captures is None else bool(captures(batch))
        self.mirror.post({"op": "graph"} | header, arrays)

        def replay(batch: ForwardBatch) -> Array:
            with self.mirror.unposted():
                return self.graphs.run(batch)

        return self.mirror.guard(lambda: self.mirror.steps.replay(batch, header, replay))
