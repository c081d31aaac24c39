"""Tensor and expert parallelism on the ``cpu`` comm backend: a model split over 2 ranks (each running
its own `LLM` on the same requests) gives the greedy tokens of the unsplit model and log-probabilities
within 1e-5, and each rank reads only its own share of the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas_core.comm import CommError
from atlas_core.comm.rendezvous import WorldAddress
from atlas_core.errors import ConfigError
from atlas_core.model.layers.moe import config_num_experts
from atlas_core.model.sharding import ShardPlan
from atlas_core.testing.ranks import run_ranks
from tests.conftest import REPOSITORY, TINY, BorrowedCheckpoints
from tests.parallel.split_runs import KV_GIB, greedy, run_split

CASES = [  # (checkpoint, tensor_parallel_size, expert_parallel_size)
    ("llama", 2, 1),
    ("llama3_tied", 2, 1),
    ("qwen3", 2, 1),
    ("qwen3_moe", 1, 2),
    ("qwen3_moe", 2, 1),
    ("qwen3_moe", 2, 2),
    ("qwen3_moe_sparse_step", 1, 2),
    ("minimax_m2", 1, 2),
    ("minimax_m2", 2, 2),
    ("deepseek_v3", 1, 2),
    ("deepseek_v3", 2, 1),
    ("deepseek_v3_no_q_lora", 2, 2),
    ("mistral4", 1, 2),
    ("mistral4", 2, 1),
    ("qwen3_next", 1, 2),
    ("qwen3_next", 2, 1),
    ("qwen3_5", 2, 1),
    ("qwen3_5_moe", 1, 2),
    ("qwen3_5_moe", 2, 2),
    ("nemotron_h", 2, 1),
    ("nemotron_h", 1, 2),
    ("nemotron_h_latent", 2, 2),
    ("gemma4_moe", 1, 2),
    ("gemma3", 2, 1),
    ("gemma4", 2, 1),
    ("gemma4_moe", 2, 2),
    ("llama_fp8_channel", 2, 1),
    ("mistral_fp8_tensor", 2, 1),
    ("qwen3_moe_fp8", 2, 2),
    ("deepseek_v3_fp8", 2, 1),
]
PROMPTS = [[1, 7, 42, 9, 100], [3, 5]]
FP8 = BorrowedCheckpoints(*sorted(REPOSITORY.glob("plugins/**/tests/fixtures/fp8")))


def checkpoint(name: str) -> Path:
    """Tiny checkpoint ``name``: a float one, or an FP8 one (kept quantized, split in its blocks)."""
    return FP8 / name if name in FP8.folders else TINY / name


@pytest.fixture(scope="module")
def split_results() -> list[list[dict[str, Any]]]:
    """Every case's results on each of 2 ranks (one pair of processes runs them all)."""
    cases = [(checkpoint(name), tp, ep) for name, tp, ep in CASES]
    return run_ranks(2, run_split, cases, PROMPTS, timeout_s=120)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{n}-tp{tp}-ep{ep}" for n, tp, ep in CASES])
def test_split_model_matches_the_whole_model(case: int, split_results: list[list[dict[str, Any]]]) -> None:
    name = CASES[case][0]
    from atlas_core import LLM

    expected = greedy(LLM(checkpoint(name), backend="numpy", kv_cache_memory_gib=KV_GIB), PROMPTS)
    for rank, results in enumerate(split_results):
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(results[case]["tokens"], expected, strict=True):
            assert tokens == want_tokens, f"rank {rank}"
            np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5, rtol=0)


def test_each_expert_parallel_rank_reads_only_its_experts(split_results: list[list[dict[str, Any]]]) -> None:
    experts = config_num_experts(TINY.config("qwen3_moe"))
    case = CASES.index(("qwen3_moe", 1, 2))
    for rank, results in enumerate(split_results):
        reads = results[case]["reads"]
        expert_reads = [(name, index) for name, index in reads if ".experts." in name]
        assert expert_reads, "no expert tensor was read"
        held = (rank * experts // 2, (rank + 1) * experts // 2)
        for name, index in expert_reads:
            expert = name.split(".experts.")[1].split(".")[0]
            if expert.isdigit():  # one tensor per expert: only the held experts' are read
                assert held[0] <= int(expert) < held[1], f"rank {rank} read {name}"
            else:  # fused [experts, ...] tensors: only the held experts' part
                assert index is not None, f"rank {rank} read all of {name}"
                assert tuple(index[0]) == held, f"rank {rank} read experts {index[0]} of {name}"
        attention = [name for name, index in reads if "self_attn" in name and index is None]
        assert attention, "attention is replicated whole when tensor_parallel_size=1"


def test_each_tensor_parallel_rank_reads_only_its_rows(split_results: list[list[dict[str, Any]]]) -> None:
    case = CASES.index(("llama", 2, 1))
    for rank, results in enumerate(split_results):
        reads = dict(results[case]["reads"])
        assert "model.layers.0.self_attn.q_proj.weight" not in [n for n, i in results[case]["reads"] if i is None]
        assert tuple(reads["model.layers.0.self_attn.q_proj.weight"][0]) == (rank * 32, (rank + 1) * 32)
        assert tuple(reads["model.layers.0.mlp.down_proj.weight"][1]) == (rank * 64, (rank + 1) * 64)
        assert tuple(reads["lm_head.weight"][0]) == (rank * 128, (rank + 1) * 128)


def test_sizes_that_do_not_compose_are_refused() -> None:
    with pytest.raises(ConfigError, match="expert_parallel_size=4 must divide tensor_parallel_size=2"):
        ShardPlan(0, 2, 4)
    assert ShardPlan(1, 1, 4).world_size == 4
    assert ShardPlan(1, 1, 4).split(8, "heads") == range(8)
    assert ShardPlan(3, 4, 2).experts(8) == range(4, 8)
    assert ShardPlan(3, 4, 2).expert_rows(32) == range(16, 32)


def test_a_rank_started_with_other_sizes_is_refused() -> None:
    from atlas_core.backends.select import select_backend
    from atlas_core.parallel.world import join_world
    from atlas_core.plugins import get_registry

    with pytest.raises(CommError, match="make a world of 2 ranks, but this rank was started as rank 0 of 1"):
        join_world(
            WorldAddress(0, 1), ShardPlan(0, 2, 1), get_registry(), select_backend(get_registry(), "numpy"), "cpu", {}
        )


def test_a_family_that_cannot_split_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas_model_llama.loader import LlamaLoader

    from atlas_core.backends.select import select_backend
    from atlas_core.comm import SingleProcessComm
    from atlas_core.errors import ModelLoadError
    from atlas_core.model.load import load_model
    from atlas_core.model.sharding import TensorParallel
    from atlas_core.plugins import get_registry

    monkeypatch.setattr(LlamaLoader, "supports_tensor_parallel", False)  # a third party's family that has not opted in
    registry, folder = get_registry(), TINY / "llama"
    backend = select_backend(registry, "numpy")
    with pytest.raises(ModelLoadError, match="'llama' family .* cannot split a model by tensor parallelism"):
        load_model(folder, backend, registry, parallel=TensorParallel(ShardPlan(0, 2, 1), SingleProcessComm()))
    monkeypatch.setattr(LlamaLoader, "supports_expert_parallel", False)
    with pytest.raises(ModelLoadError, match="'llama' family .* cannot split a model over ranks"):
        load_model(folder, backend, registry, parallel=TensorParallel(ShardPlan(0, 1, 2), SingleProcessComm()))


def test_random_weights_split_over_rank_processes_give_the_unsplit_tokens() -> None:
    """Every rank builds its share of the same random model (`load_format="dummy"` values depend on the
    tensor's name only), so the split model answers as the whole one."""
    from atlas_core.bench.random_weights import random_weights_llm

    shape = str(TINY / "qwen3_moe")
    with random_weights_llm(shape, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = greedy(whole, PROMPTS)
    with random_weights_llm(
        shape, backend="numpy", kv_cache_memory_gib=KV_GIB, tensor_parallel_size=2, expert_parallel_size=2
    ) as split:
        assert split.mirror is not None
        got = greedy(split, PROMPTS)
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5, rtol=0)


def test_fp8_kv_with_high_precision_layers_splits_as_the_whole_model(tmp_path: Path) -> None:
    """Every rank stores its heads' KV in fp8 with rank 0's scales (a calibrated file's, here not 1.0), except the
    layers kept in high precision, as rank 0 tells it: the split model answers as the whole one."""
    from atlas_core import LLM
    from atlas_core.engine.kv_calibration import write_kv_scales

    scales = tmp_path / "scales.json"
    write_kv_scales(scales, [(0.03, 0.05), (0.5, 0.25), (0.02, 0.04)], "llama")
    settings: dict[str, Any] = {
        "kv_cache_dtype": "fp8",
        "kv_high_precision_layers": ["0"],
        "kv_cache_scales": str(scales),
    }
    with LLM(TINY / "llama", backend="numpy", kv_cache_memory_gib=KV_GIB, **settings) as whole:
        expected = greedy(whole, PROMPTS)
    with LLM(TINY / "llama", backend="numpy", kv_cache_memory_gib=KV_GIB, tensor_parallel_size=2, **settings) as split:
        assert split.mirror is not None and split.engine.kv.scales == [None, (0.5, 0.25), (0.02, 0.04)]
        got = greedy(split, PROMPTS)
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5, rtol=0)
