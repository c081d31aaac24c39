"""Checks of the ``nccl`` comm backend on GPUs, in one run (exit status 1 when one fails).

    python3 plugins/comm/scripts/check_nccl.py [--tokens N]

1. Every machine with a GPU: `NcclComm` at world size 1 (the same code path, collectives over one rank):
   all-reduce (float32, bfloat16), all-gather along two axes, broadcast, and an all-reduce captured into
   a CUDA graph and replayed twice.
2. Two GPUs or more: two processes, one GPU each: every collective against its definition, all-reduce
   results bitwise equal on both ranks, and the all-reduce bus bandwidth of 256 MiB of bfloat16; the
   peer-memory all-reduce set up, equal to NCCL's bit for bit, and both timed on a decode step's row.
3. Two GPUs or more: the tiny checkpoints on the ``cuda`` backend split over two ranks (TP=2 on llama and
   qwen3, EP=2 and TP=2 x EP=2 on qwen3_moe) against one rank: greedy tokens identical, and the largest
   log-probability difference printed (bfloat16 tolerance: 0.05); the split runs' decode steps replay
   CUDA graphs on every rank (the count of rank 0's replays is printed), posted through shared memory; and, without
   log-probabilities, with decode steps queued ahead (their token ids broadcast from rank 0), the same tokens.

Run from the repository root with atlas-core, the model families, atlas-gb10 and atlas-comm-nccl installed.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[3]
TINY = {
    "llama": REPO / "plugins/models/llama/tests/fixtures/tiny/llama",
    "qwen3": REPO / "plugins/models/qwen3/tests/fixtures/tiny/qwen3",
    "qwen3_moe": REPO / "plugins/models/qwen3-moe/tests/fixtures/tiny/qwen3_moe",
}
SPLITS = [("llama", 2, 1), ("qwen3", 2, 1), ("qwen3_moe", 1, 2), ("qwen3_moe", 2, 2)]
LOGPROB_TOLERANCE = 0.05
BANDWIDTH_BYTES = 256 * 2**20
GRAPH_SUMS = 64

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)


def collectives(comm: Any) -> dict[str, np.ndarray]:
    """Every collective once, on this rank's part; the results as host arrays."""
    import cupy
    import ml_dtypes

    rank, world = comm.rank, comm.world_size
    part = cupy.arange(12, dtype=cupy.float32).reshape(3, 4) * (rank + 1) / 4
    out = {"all_reduce": cupy.asnumpy(comm.all_reduce(part.copy()))}
    bf16 = cupy.asarray(np.random.default_rng(rank).standard_normal((64, 33)).astype(ml_dtypes.bfloat16))
    out["all_reduce_bf16"] = cupy.asnumpy(comm.all_reduce(bf16)).view(np.uint16)
    out["all_gather_0"] = cupy.asnumpy(comm.all_gather(part, axis=0))
    out["all_gather_1"] = cupy.asnumpy(comm.all_gather(part, axis=1))
    root = part.copy() if rank == world - 1 else cupy.zeros((3, 4), cupy.float32)
    out["broadcast"] = cupy.asnumpy(comm.broadcast(root, root=world - 1))
    out["captured"] = captured_all_reduce(comm)
    if world > 1:
        if rank == 0:
            comm.send(cupy.full(5, 7, cupy.int64), 1)
        elif rank == 1:
            out["recv"] = cupy.asnumpy(comm.recv(cupy.empty(5, cupy.int64), 0))
    cupy.cuda.get_current_stream().synchronize()
    return out


def captured_all_reduce(comm: Any) -> np.ndarray:
    """Rank r's ``r + 1`` summed over ranks by an all-reduce captured into a CUDA graph, replayed twice (each
    replay sums in place again), with `NcclComm.wait` after each replay."""
    import cupy

    x = cupy.full(1024, comm.rank + 1, dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        comm.all_reduce(x)  # eager first: NCCL sets up its connections outside the capture
        x[:] = comm.rank + 1
        stream.synchronize()
        stream.begin_capture()
        comm.all_reduce(x)
        graph = stream.end_capture()
        for _ in range(2):
            graph.launch(stream)
            comm.wait()
    return cupy.asnumpy(x)


def expected_part(rank: int) -> np.ndarray:
    return np.arange(12, dtype=np.float32).reshape(3, 4) * (rank + 1) / 4


def check_collectives(results: list[dict[str, np.ndarray]]) -> None:
    world = len(results)
    parts = [expected_part(rank) for rank in range(world)]
    for rank, out in enumerate(results):
        check(np.allclose(out["all_reduce"], sum(parts)), f"rank {rank}: all_reduce float32")
        check(np.array_equal(out["all_gather_0"], np.concatenate(parts, axis=0)), f"rank {rank}: all_gather axis 0")
        check(np.array_equal(out["all_gather_1"], np.concatenate(parts, axis=1)), f"rank {rank}: all_gather axis 1")
        check(np.array_equal(out["broadcast"], parts[-1]), f"rank {rank}: broadcast from rank {world - 1}")
        check(
            np.array_equal(out["all_reduce_bf16"], results[0]["all_reduce_bf16"]), f"rank {rank}: bf16 sum == rank 0's"
        )
        summed = world * (world + 1) / 2
        check(bool(np.all(out["captured"] == world * summed)), f"rank {rank}: all-reduce in a CUDA graph, 2 replays")
    if world > 1:
        check(np.array_equal(results[1]["recv"], np.full(5, 7)), "rank 1: recv from rank 0")


def world_of_one() -> None:
    from atlas_comm_nccl.nccl import NcclComm

    from atlas_core.comm.rendezvous import Rendezvous, WorldAddress

    print("1. nccl at world size 1", flush=True)
    comm = NcclComm.connect(Rendezvous.meet(WorldAddress(0, 1), {}), None)
    check_collectives([collectives(comm)])
    comm.close()


def two_rank_collectives(address: Any) -> dict[str, Any]:
    """One rank of stage 2 (run in its own process by `run_ranks`)."""
    import cupy
    from atlas_comm_nccl.nccl import NcclComm

    from atlas_core.comm.rendezvous import Rendezvous

    cupy.cuda.Device(address.rank).use()
    comm = NcclComm.connect(Rendezvous.meet(address, {}), None)
    out: dict[str, Any] = dict(collectives(comm))
    out |= peer_against_nccl(comm)
    x = cupy.ones(BANDWIDTH_BYTES // 2, dtype=cupy.float16)
    for _ in range(3):
        comm.all_reduce(x)
    repeats = 20
    start = time.perf_counter()
    for _ in range(repeats):
        comm.all_reduce(x)
    elapsed = (time.perf_counter() - start) / repeats
    world = comm.world_size
    out["bus_gbps"] = BANDWIDTH_BYTES / elapsed * 2 * (world - 1) / world / 1e9
    comm.close()
    return out


def peer_against_nccl(comm: Any) -> dict[str, Any]:
    """The peer-memory all-reduce (when the ranks set it up) against NCCL's: random bfloat16 decode-sized sums, and
    the time of one all-reduce of a 4,096-wide bfloat16 row in a CUDA graph of `GRAPH_SUMS` of them, each way."""
    import cupy
    import ml_dtypes

    out: dict[str, Any] = {"peer": comm.peer is not None}
    peer = comm.peer
    rows = np.random.default_rng(10 + comm.rank).standard_normal((64, 4096)).astype(ml_dtypes.bfloat16)
    x, y = cupy.asarray(rows), cupy.asarray(rows)
    comm.all_reduce(x)
    comm.peer = None
    comm.all_reduce(y)
    comm.peer = peer
    out["peer_equals_nccl"] = bool((x.view(cupy.uint16) == y.view(cupy.uint16)).all())
    for name, use in (("nccl", None), ("peer", peer)):
        if name == "peer" and peer is None:
            continue
        comm.peer = use
        row = cupy.ones(4096, dtype=ml_dtypes.bfloat16)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            comm.all_reduce(row)
            stream.begin_capture()
            for _ in range(GRAPH_SUMS):
                comm.all_reduce(row)
            graph = stream.end_capture()
            for _ in range(3):
                graph.launch(stream)
                comm.wait()
            start = time.perf_counter()
            for _ in range(20):
                graph.launch(stream)
            comm.wait()
            out[f"{name}_us"] = (time.perf_counter() - start) / 20 / GRAPH_SUMS * 1e6
        del graph
    comm.peer = peer
    return out


def two_ranks() -> None:
    from atlas_core.testing.ranks import run_ranks

    print("2. nccl over two processes, one GPU each", flush=True)
    results = run_ranks(2, two_rank_collectives, timeout_s=300)
    extra = ("bus_gbps", "peer", "peer_equals_nccl", "nccl_us", "peer_us")
    check_collectives([{k: v for k, v in r.items() if k not in extra} for r in results])
    for rank, r in enumerate(results):
        check(r["peer"], f"rank {rank}: small all-reduces go through peer memory")
        check(r["peer_equals_nccl"], f"rank {rank}: peer all-reduce of 64 x 4096 bfloat16 == NCCL's, bit for bit")
        timings = ", ".join(f"{name} {r[f'{name}_us']:.2f} us" for name in ("nccl", "peer") if f"{name}_us" in r)
        print(f"  rank {rank}: one all-reduce of 4096 bfloat16 in a graph of {GRAPH_SUMS}: {timings}", flush=True)
    print(
        f"  all-reduce of {BANDWIDTH_BYTES >> 20} MiB (float16), bus bandwidth: "
        + ", ".join(f"rank {rank} {r['bus_gbps']:.1f} GB/s" for rank, r in enumerate(results)),
        flush=True,
    )


def generate(
    folder: Path, tokens: int, logprobs: int | None = 1, **engine: Any
) -> tuple[list[tuple[list[int], list[float]]], int, int]:
    """Greedy tokens (with their log-probabilities, given ``logprobs``) of the fixture's prompts, the decode steps
    that replayed graphs and those queued ahead of reading the tokens before them (which steps with log-probabilities
    never are)."""
    from atlas_core import LLM, SamplingParams

    with np.load(folder / "reference.npz") as reference:
        prompts = [[int(t) for t in reference[f"prompt_{i}"]] for i in range(4)]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=logprobs, ignore_eos=True)
    llm = LLM(folder, backend="cuda", gpu_memory_utilization=0.3, max_seq_len=512, comm_timeout=120, **engine)
    try:
        outputs = llm.generate(prompts, params)
        graphs = llm.engine.runner.decode_graphs
        replays = int(getattr(getattr(graphs, "graphs", graphs), "replays", 0))
        queued = int(getattr(llm.engine.runner.ahead, "hits", 0))  # no reference kept: the KV cache is freed below
        mirror = llm.loaded.model.mirror
        if mirror is not None:
            check(mirror.world.rendezvous.ring is not None, "rank 0 posts the steps through shared memory")
    finally:
        llm.close()
        del llm
        gc.collect()
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()  # the next LLM sizes its KV cache from free memory
    results = []
    for output in outputs:
        completion = output.outputs[0]
        entries = completion.logprobs or []
        results.append(
            (completion.token_ids, [e[t].logprob for t, e in zip(completion.token_ids, entries, strict=False)])
        )
    return results, replays, queued


def split_models(tokens: int) -> None:
    print("3. tiny checkpoints on cuda: split over two GPUs against one", flush=True)
    whole: dict[str, Any] = {}
    for name, tp, ep in SPLITS:
        if name not in whole:
            whole[name] = generate(TINY[name], tokens)[0]
        split, replays, _ = generate(TINY[name], tokens, tensor_parallel_size=tp, expert_parallel_size=ep)
        check(replays > 0, f"{name} TP={tp} EP={ep}: {replays} decode steps replayed CUDA graphs")
        plain, _, queued = generate(TINY[name], tokens, None, tensor_parallel_size=tp, expert_parallel_size=ep)
        check(queued > 0, f"{name} TP={tp} EP={ep}, no logprobs: {queued} decode steps queued ahead")
        check(
            [a[0] for a in plain] == [b[0] for b in whole[name]],
            f"{name} TP={tp} EP={ep}, steps queued ahead: greedy tokens == one rank",
        )
        same = all(a[0] == b[0] for a, b in zip(split, whole[name], strict=True))
        diff = max(
            max(abs(x - y) for x, y in zip(a[1], b[1], strict=False))
            for a, b in zip(split, whole[name], strict=True)
            if a[1]
        )
        check(same, f"{name} TP={tp} EP={ep}: greedy tokens == one rank")
        check(diff <= LOGPROB_TOLERANCE, f"{name} TP={tp} EP={ep}: largest logprob difference {diff:.4f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens per prompt in stage 3")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast: it can take a shared host's GPUs down
    import cupy

    gpus = cupy.cuda.runtime.getDeviceCount()
    print(f"{gpus} GPU(s): {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
    world_of_one()
    if gpus >= 2:
        two_ranks()
        split_models(args.tokens)
    else:
        print("stages 2 and 3 need two GPUs: not run", flush=True)
    print(f"{len(failures)} failure(s)" + (": " + "; ".join(failures) if failures else ""), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
