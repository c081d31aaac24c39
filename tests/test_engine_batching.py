"""Continuous batching invariants on the tiny checkpoints: a greedy sequence's tokens do not
depend on what else runs beside it, how its prompt is chunked, or whether its prefix was cached."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from tests.conftest import TINY

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def mixed_prompts(vocab: int, count: int = 18, seed: int = 7) -> list[list[int]]:
    """Prompts of very different lengths, some sharing a 40-token prefix (prefix-cache hits)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, vocab, 40).tolist()
    prompts = []
    for i in range(count):
        length = int(rng.integers(1, 90))
        tail = rng.integers(0, vocab, length).tolist()
        prompts.append(shared + tail if i % 3 == 0 else tail)
    return prompts


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(model_name: str) -> dict[int, list[int]]:
    """Each prompt's greedy tokens when it runs alone, without prefix caching or chunking."""
    llm = LLM(TINY / model_name, enable_prefix_caching=False)
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    return {i: llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for i, prompt in enumerate(prompts)}


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
def test_greedy_tokens_are_batch_invariant(model_name: str, alone: dict[int, list[int]], settings: dict) -> None:
    llm = LLM(TINY / model_name, **settings)
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    runs = 2 if settings["enable_prefix_caching"] else 1  # the second run hits the cache the first filled
    for _ in range(runs):
        outputs = llm.generate(prompts, GREEDY)
        for i, output in enumerate(outputs):
            assert output.outputs[0].token_ids == alone[i], f"prompt {i} ({len(prompts[i])} tokens)"
        assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks
    if settings["enable_prefix_caching"]:
        assert sum(o.num_cached_tokens for o in outputs) > 0


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


def test_preemption_under_kv_pressure_keeps_outputs(model_name: str, alone: dict[int, list[int]]) -> None:
    """A KV cache far too small for the batch forces preemption by recompute; outputs are unchanged."""
    llm = LLM(TINY / model_name, block_size=4, max_seq_len=128, kv_cache_memory_gib=_gib_for_tokens(model_name, 160))
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    for i, output in enumerate(outputs):
        assert output.outputs[0].token_ids == alone[i], f"prompt {i}"
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks


def _gib_for_tokens(model_name: str, tokens: int) -> float:
    """A KV budget holding about ``tokens`` tokens of the tiny model (fp32)."""
    layers = 3 if model_name == "llama" else 2
    return tokens * layers * 2 * 2 * 16 * 4 / 2**30
