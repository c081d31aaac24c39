"""Continuous batching on the Gemma fixtures, whose sliding-window layers (window 8) see only part of
the context: greedy tokens do not depend on the batch, on how a prompt longer than the window is
chunked (chunks shorter than, equal to, and straddling the window), on block size, or on prefix caching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import assert_batch_invariant, greedy_alone, mixed_prompts

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
MODELS = ["gemma3", "gemma4", "gemma4_moe"]


@pytest.fixture(scope="module", params=MODELS)
def model_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(model_name: str) -> list[list[int]]:
    """Each of the 18 `mixed_prompts`' greedy tokens when it runs alone, without prefix caching, in one
    prefill step."""
    return greedy_alone(TINY / model_name, count=18, backend="numpy")


def test_most_prompts_outrun_the_window(model_name: str) -> None:
    prompts = mixed_prompts(LLM(TINY / model_name, backend="numpy").loaded.model.vocab_size)
    assert sum(len(p) > 8 for p in prompts) >= len(prompts) // 2


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
def test_greedy_tokens_are_batch_invariant(model_name: str, alone: list[list[int]], settings: dict) -> None:
    assert_batch_invariant(TINY / model_name, alone, settings, backend="numpy")


@pytest.mark.parametrize("chunk", [1, 5, 7, 8, 9, 13])
def test_chunked_prefill_matches_transformers(model_name: str, chunk: int) -> None:
    """The 40-token reference prompt prefilled ``chunk`` tokens per step: the greedy continuation and
    its log-probs are those of transformers (one-step prefill), for chunks around the window of 8."""
    ref = TINY.reference(model_name)
    llm = LLM(TINY / model_name, backend="numpy", max_num_batched_tokens=chunk, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    completion = llm.generate(ref["prompt_3"].tolist(), params)[0].outputs[0]
    assert completion.token_ids == ref["greedy_3"].tolist()
    got = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
    want = [ref["greedy_logprobs_3"][j, token] for j, token in enumerate(completion.token_ids)]
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
