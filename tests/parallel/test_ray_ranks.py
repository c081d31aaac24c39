"""A split model whose ranks 1.. run as Ray actors (``distributed_executor_backend="ray"``) on a local Ray
cluster of this machine: the same tokens as the whole model, a clear error when an actor dies or the cluster
is too small, and everything held for the actors released when the replica closes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atlas_core import LLM
from atlas_core.comm import CommError
from atlas_core.errors import ConfigError
from atlas_core.parallel.replica import Replica
from atlas_core.parallel.settings import ReplicaSettings
from tests.conftest import TINY
from tests.parallel.split_runs import KV_GIB, greedy

PROMPTS = [[1, 7, 42, 9, 100], [3, 5], [200, 4, 4, 4]]
CLUSTER_CPUS = 2


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray cluster of `CLUSTER_CPUS` CPUs, this test process its driver (the replicas use it). Its
    workers run this interpreter: Ray would otherwise rebuild the test environment for them when the tests run
    under ``uv run`` (read when Ray is imported)."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=CLUSTER_CPUS, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def ray_llm(**settings: Any) -> LLM:
    return LLM(
        TINY / "llama", backend="numpy", kv_cache_memory_gib=KV_GIB, distributed_executor_backend="ray", **settings
    )


def replica_of(llm: LLM) -> Replica:
    assert llm.mirror is not None
    replica = llm.mirror.close.__self__  # type: ignore[attr-defined]
    assert isinstance(replica, Replica)
    return replica


def wait_for_free_cpus(ray: Any, cpus: int, within_s: float = 10.0) -> None:
    """Wait until ``cpus`` CPUs of the cluster are free again (Ray frees a removed group's bundles soon after)."""
    deadline = time.monotonic() + within_s
    while ray.available_resources().get("CPU", 0) < cpus:
        assert time.monotonic() < deadline, f"the cluster still holds CPUs: {ray.available_resources()}"
        time.sleep(0.1)


def test_ray_actor_ranks_match_the_whole_model_and_are_released(ray_cluster: Any) -> None:
    with LLM(TINY / "llama", backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = greedy(whole, PROMPTS)
    llm = ray_llm(tensor_parallel_size=2)
    try:
        assert replica_of(llm).processes == []  # no process of this host: the rank is an actor
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(greedy(llm, PROMPTS), expected, strict=True):
            assert tokens == want_tokens
            np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5, rtol=0)
    finally:
        llm.close()
    assert ray_cluster.is_initialized()  # the test's own connection is left alone
    wait_for_free_cpus(ray_cluster, CLUSTER_CPUS)  # the actor is gone and its placement group removed


def test_a_killed_actor_fails_the_next_step_with_a_clear_error(ray_cluster: Any) -> None:
    llm = ray_llm(tensor_parallel_size=2, comm_timeout=20)
    try:
        (actor,) = replica_of(llm).ranks.actors  # type: ignore[attr-defined]
        ray_cluster.kill(actor)
        gone = (
            r"rank 1 ended: its process exited|with rank 1 failed: .*(closed the connection|broke)"
            r"|rank 1 stopped taking work: .*(closed the connection|broke)"
        )
        with pytest.raises(CommError, match=gone):
            llm.generate(PROMPTS)
    finally:
        llm.close()
    wait_for_free_cpus(ray_cluster, CLUSTER_CPUS)


def test_a_cluster_too_small_is_refused_at_once_or_after_comm_timeout(ray_cluster: Any) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group

    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"the Ray cluster has 2 CPUs, but ranks 1..3 need 3"):
        ray_llm(tensor_parallel_size=4)
    held = placement_group([{"CPU": CLUSTER_CPUS}])  # other work holds every CPU
    ray_cluster.get(held.ready())
    try:
        with pytest.raises(CommError, match=r"did not free 1 CPUs for ranks 1..1 within 1 s \(comm_timeout; 0 of 2"):
            ray_llm(tensor_parallel_size=2, comm_timeout=1)
    finally:
        remove_placement_group(held)
    assert time.monotonic() - started < 10


def test_ray_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'atlas-core\[ray\]'"):
        ray_llm(tensor_parallel_size=2)


def test_ray_launcher_and_ranks_started_by_hand_exclude_each_other() -> None:
    with pytest.raises(ConfigError, match="distributed_executor_backend=ray starts ranks 1.. itself"):
        ReplicaSettings(tensor_parallel_size=2, rank=0, world_size=2, distributed_executor_backend="ray")
