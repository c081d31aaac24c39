"""Continuous batching on the Gemma fixtures, whose sliding-window layers (window 8) see only part of
the context: greedy tokens do not depend on the batch, on how a prompt longer than the window is
chunked (chunks shorter than, equal to, and straddling the window), on block size, or on prefix caching."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from tests.conftest import TINY, reference
from tests.test_engine_batching import GREEDY, mixed_prompts

MODELS = ["gemma3", "gemma4", "gemma4_moe"]


@pytest.fixture(scope="module", params=MODELS)
def model_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(model_name: str) -> dict[int, list[int]]:
    """Each prompt's greedy tokens when it runs alone, without prefix caching, in one prefill step."""
    llm = LLM(TINY / model_name, backend="numpy", enable_prefix_caching=False)
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    return {i: llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for i, prompt in enumerate(prompts)}


@pytest.mark.parametrize(
    "settings",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": True, "block_size": 4},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
        {"enable_prefix_caching": True, "max_num_batched_tokens": 11, "block_size": 8},
    ],
    ids=["batched", "prefix-cache-small-blocks", "chunks-of-3", "budget-11-window-sized-blocks"],
)
def test_greedy_tokens_are_batch_invariant(model_name: str, alone: dict[int, list[int]], settings: dict) -> None:
    llm = LLM(TINY / model_name, backend="numpy", **settings)
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    assert sum(len(p) > 8 for p in prompts) >= len(prompts) // 2  # most prompts outrun the window
    runs = 2 if settings["enable_prefix_caching"] else 1  # the second run hits the cache the first filled
    for _ in range(runs):
        outputs = llm.generate(prompts, GREEDY)
        for i, output in enumerate(outputs):
            assert output.outputs[0].token_ids == alone[i], f"prompt {i} ({len(prompts[i])} tokens)"
        assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks
    if settings["enable_prefix_caching"]:
        assert sum(o.num_cached_tokens for o in outputs) > 0


@pytest.mark.parametrize("chunk", [1, 5, 7, 8, 9, 13])
def test_chunked_prefill_matches_transformers(model_name: str, chunk: int) -> None:
    """The 40-token reference prompt prefilled ``chunk`` tokens per step: the greedy continuation and
    its log-probs are those of transformers (one-step prefill), for chunks around the window of 8."""
    ref = reference(model_name)
    llm = LLM(TINY / model_name, backend="numpy", max_num_batched_tokens=chunk, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    completion = llm.generate(ref["prompt_3"].tolist(), params)[0].outputs[0]
    assert completion.token_ids == ref["greedy_3"].tolist()
    got = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
    want = [ref["greedy_logprobs_3"][j, token] for j, token in enumerate(completion.token_ids)]
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
