"""Continuous batching invariants on the tiny checkpoints: a greedy sequence's tokens do not
depend on what else runs beside it, how its prompt is chunked, or whether its prefix was cached."""

from __future__ import annotations

import pytest

from atlas_core import LLM
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.testing.family import GREEDY, assert_batch_invariant, assert_no_leaks, greedy_alone, mixed_prompts
from tests.conftest import TINY


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(model_name: str) -> list[list[int]]:
    """Each of the 18 `mixed_prompts`' greedy tokens when it runs alone, without prefix caching or chunking."""
    return greedy_alone(TINY / model_name, count=18)


@pytest.mark.parametrize(
    "settings",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": True},
        {"enable_prefix_caching": True, "max_num_batched_tokens": 7},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
        {"enable_prefix_caching": True, "max_num_seqs": 5, "block_size": 4},
    ],
    ids=["batched", "prefix-cache", "tiny-budget", "tiny-chunks", "few-seqs-small-blocks"],
)
def test_greedy_tokens_are_batch_invariant(model_name: str, alone: list[list[int]], settings: dict) -> None:
    assert_batch_invariant(TINY / model_name, alone, settings)


def test_prefix_cache_hit_reports_cached_tokens_and_same_output() -> None:
    llm = LLM(TINY / "qwen3", block_size=8)
    prompt = mixed_prompts(256, count=1)[0] + list(range(30))
    first = llm.generate(prompt, GREEDY)[0]
    second = llm.generate(prompt[:-3] + [5, 6, 7], GREEDY)[0]
    again = llm.generate(prompt, GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (len(prompt) - 4) // 8 * 8
    assert again.num_cached_tokens == (len(prompt) - 1) // 8 * 8
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    uncached = LLM(TINY / "qwen3", block_size=8, enable_prefix_caching=False)
    assert uncached.generate(prompt[:-3] + [5, 6, 7], GREEDY)[0].outputs[0].token_ids == second.outputs[0].token_ids
    assert llm.engine.blocks.hit_rate > 0


def test_preemption_under_kv_pressure_keeps_outputs(model_name: str, alone: list[list[int]]) -> None:
    """A KV cache far too small for the batch forces preemption by recompute; outputs are unchanged."""
    llm = LLM(TINY / model_name, block_size=4, max_seq_len=128, kv_cache_memory_gib=_gib_for_tokens(model_name, 160))
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    for i, output in enumerate(outputs):
        assert output.outputs[0].token_ids == alone[i], f"prompt {i}"
    assert_no_leaks(llm)


def _gib_for_tokens(model_name: str, tokens: int) -> float:
    """A KV budget holding about ``tokens`` tokens of the tiny model (fp32)."""
    layers = 3 if model_name == "llama" else 2
    return tokens * layers * 2 * 2 * 16 * 4 / 2**30


def test_token_budget_is_the_backends_unless_set() -> None:
    """Unset, the step's token budget is the backend's (2,048 on the host backends); a set budget is kept, and the
    caller's config is not changed."""
    config = EngineConfig()
    llm = LLM(TINY / "llama", backend="numpy")
    assert llm.engine.config.max_num_batched_tokens == llm.backend.default_token_budget() == 2048
    assert LLM(TINY / "llama", max_num_batched_tokens=96).engine.config.max_num_batched_tokens == 96
    engine = LLMEngine(llm.loaded, llm.backend, config)
    assert engine.config.max_num_batched_tokens == 2048 and config.max_num_batched_tokens is None
