"""The ranks other than 0 of a split replica: load this rank's shard, then run what rank 0 posts.

Each instruction (`atlas_core.parallel.mirror`) is run in the order posted: ``mtp`` builds this rank's
shard of the checkpoint's MTP head (MTP speculation), ``kv`` allocates this rank's KV cache (the MTP
head's layers after the model's), ``copy_blocks`` copies blocks in it, ``state`` makes a recurrent-state
slot call (allocate, reset, copy), ``forward`` runs the model (or a chained step of the MTP head) over the
posted `ForwardBatch`, ``graph`` runs the model and its logits over it through this rank's captured
decode graphs (`atlas_core.parallel.mirror.MirroredGraphs`) and waits for the step's collectives (for those of
the step before it, when the step was queued ahead: `atlas_core.parallel.mirror.StepWaits`; its token ids then
come from rank 0's broadcast, as for a ``forward``),
``logits`` takes rank 0's broadcast hidden rows and projects them (through the MTP step's own LM head
when it has one), ``tiers`` opens this rank's KV storage tiers, ``tier`` runs their queued operations
and ``loads`` settles loads with rank 0 (`atlas_core.parallel.tier_follow`), ``stop`` ends the loop. A
rank that fails tells rank 0 why before it ends (rank 0 then fails the replica with that message); a
rank whose rank 0 is gone ends with `CommError`. Rank 0 alone runs a vision tower and a draft model:
their results reach this rank as posted batches (image features) or as the drafts a verify forward
checks.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import numpy as np

from atlas_core.backends.base import Backend
from atlas_core.backends.select import select_backend
from atlas_core.batch.kv_cache import KVCache, KVPlan, kv_storage_layouts, with_kv_scales
from atlas_core.comm import CommError
from atlas_core.comm.rendezvous import WorldAddress
from atlas_core.comm.wire import send_message
from atlas_core.errors import ConfigError
from atlas_core.kvtiers.agree import closed_everywhere
from atlas_core.model.load import LoadedModel
from atlas_core.model.mtp import MtpHead, load_mtp_head
from atlas_core.parallel.batch_wire import decode_batch, ids_from_rank_0
from atlas_core.parallel.mirror import StepWaits
from atlas_core.parallel.settings import ReplicaSettings
from atlas_core.parallel.tier_follow import TierFollower
from atlas_core.parallel.world import World, join_replica, load_shard
from atlas_core.plugins import get_registry

log = logging.getLogger("atlas.parallel")

STATE_CALLS = ("allocate_state", "reset_state", "copy_state")
"""The recurrent-state calls of `TransformerModel` that rank 0 may post."""


def run_worker(
    model: str | None, backend_name: str | None, settings: ReplicaSettings, address: WorldAddress | None = None
) -> None:
    """Be rank ``address.rank`` of the replica serving ``model`` (default: the rank, world size and master
    address of ``settings``, ranks started by hand): join it, load this rank's shard, and run rank 0's
    instructions until it says stop. Raises what failed (after telling rank 0)."""
    if address is None:
        port = settings.port
        if not settings.rank or settings.world_size is None or port is None:
            raise ConfigError("a worker rank needs rank (1 or more) and world_size")
        address = WorldAddress(settings.rank, settings.world_size, settings.master_addr, port, settings.comm_timeout)
    registry = get_registry()
    backend = select_backend(registry, backend_name)
    backend.batch_invariant = settings.batch_invariant  # the kernels rank 0's engine uses
    world = join_replica(model, backend, registry, settings, address)
    try:
        loaded = load_shard(model, backend, registry, settings, world)
        follow(world, loaded, backend)
    except BaseException as exc:
        _report(world, exc)
        raise
    finally:
        world.close()


def main(argv: list[str] | None = None) -> int:
    """A rank process started by `atlas_core.parallel.replica` (``python -m atlas_core.parallel.worker JSON``:
    the model, backend, replica settings and this rank's address); the exit status."""
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    address = WorldAddress(**spec["address"])
    logging.basicConfig(level=logging.WARNING, format=f"rank {address.rank}: %(levelname)s %(name)s: %(message)s")
    try:
        run_worker(spec["model"], spec["backend"], ReplicaSettings(**spec["settings"]), address)
    except CommError as exc:  # rank 0 went away or failed: nothing more to say than that
        log.error("%s", exc)
        return 1
    return 0


def follow(world: World, loaded: LoadedModel, backend: Backend) -> None:
    """Run rank 0's instructions on this rank's shard ``loaded`` until ``stop``; then close the storage tiers and
    release the decode graphs (before the communicator whose collectives they hold is closed)."""
    tiers: list[TierFollower] = []
    graphs: list[Any] = []
    try:
        _follow(world, loaded, backend, tiers, graphs)
    finally:
        for follower in tiers:
            follower.close()
        for captured in graphs:
            captured.close()


def _follow(world: World, loaded: LoadedModel, backend: Backend, tiers: list[TierFollower], graphs: list[Any]) -> None:
    model = loaded.model
    comm = world.parallel.comm
    steps = StepWaits(comm)
    kv: KVCache | None = None
    mtp: MtpHead | None = None
    while True:
        header, arrays = world.rendezvous.receive()
        op = header.get("op")
        step = header.get("mtp_step")
        if op == "stop":
            return
        if op in ("tier", "loads", "tiers_closed") and not tiers:
            raise CommError(f"rank {world.rank}: rank 0 sent {op!r} before opening the storage tiers")
        if op == "tier":
            tiers[0].run(header["ops"])
        elif op == "loads":
            tiers[0].poll(header["ids"])
        elif op == "tiers_closed":
            closed_everywhere(world.parallel, backend)
        elif op == "mtp":
            mtp = load_mtp_head(loaded, backend, int(header["max_seq_len"]), world.parallel)
        elif op == "kv":
            extra = mtp.kv_layouts if mtp is not None else []
            dtype, keep = str(header["kv_cache_dtype"]), list(header["kv_high_precision_layers"])
            layouts = kv_storage_layouts([*model.kv_layouts, *extra], dtype, backend, keep)
            layouts = with_kv_scales(layouts, header["kv_scales"])
            kv = KVCache(backend, layouts, KVPlan(int(header["num_blocks"]), int(header["block_size"]), 0))
            captured = backend.decode_graphs(model, kv)
            graphs[:] = [] if captured is None else [captured]
        elif kv is None:
            raise CommError(f"rank {world.rank}: rank 0 sent {op!r} before the KV cache's size")
        elif step is not None and mtp is None:
            raise CommError(f"rank {world.rank}: rank 0 sent an MTP {op!r} before building the MTP head")
        elif op == "tiers":
            tiers.append(TierFollower(world.parallel, backend, kv, model.recurrent_state, header))
        elif op == "copy_blocks":
            kv.copy_blocks([(int(src), int(dst)) for src, dst in arrays[0].tolist()])
        elif op == "forward":
            batch = decode_batch(backend, header, arrays)
            if ids_from_rank_0(header):
                comm.broadcast(batch.input_ids, root=0)
            if mtp is not None and step is not None:
                mtp.forward(int(step), batch, kv)
            else:
                model.forward(batch, kv)
        elif op == "graph":
            if not graphs:
                raise CommError(f"rank {world.rank}: rank 0 replays decode graphs, but this rank's backend has none")
            batch = decode_batch(backend, header, arrays)
            steps.replay(batch, header, graphs[0].run)
        elif op == "state" and header.get("call") in STATE_CALLS:
            getattr(model, header["call"])(*header["args"])
        elif op == "logits":
            hidden = comm.broadcast(backend.zeros(tuple(header["shape"]), np.dtype(header["dtype"])))
            if mtp is not None and step is not None:
                mtp.own_logits(hidden, int(step))
            else:
                model.compute_logits(hidden)
        else:
            raise CommError(f"rank {world.rank}: rank 0 sent an unknown instruction {op!r}")


def _report(world: World, exc: BaseException) -> None:
    """Tell rank 0 why this rank ends (best effort: rank 0 may be gone already)."""
    if world.rank == 0 or 0 not in world.rendezvous.peers:
        return
    try:
        send_message(world.rendezvous.peers[0], {"error": f"{type(exc).__name__}: {exc}"})
    except CommError:
        pass


if __name__ == "__main__":
    sys.exit(main())
