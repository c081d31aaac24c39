"""Checks every model family's tests run on its tiny checkpoints (family plugins call them with their
own fixture folders):

* engine invariants: a sequence's greedy tokens are the same alone or batched, with chunked prefill,
  or with prefix caching (core's llama / qwen3 run these in `test_engine_batching`);
* reference sensitivity: how far a (deliberately altered) model's prompt log-probs are from the
  transformers reference, to show the parity test would catch a missing bias, scale or step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atlas_core import LLM
from tests.conftest import reference
from tests.test_engine_batching import GREEDY, mixed_prompts
from tests.test_model_parity import full_prompt_logprobs

INVARIANCE_SETTINGS: dict[str, dict[str, Any]] = {
    "batched": {"enable_prefix_caching": False},
    "prefix-cache": {"enable_prefix_caching": True},
    "tiny-chunks": {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
    "tiny-budget-small-blocks": {"enable_prefix_caching": True, "max_num_batched_tokens": 7, "block_size": 4},
}
"""Engine settings whose greedy outputs must equal each prompt's output alone (keyed by test id)."""


def greedy_alone(model_dir: Path, count: int = 12) -> list[list[int]]:
    """Each of ``count`` `mixed_prompts` run alone, without prefix caching or chunking."""
    llm = LLM(model_dir, enable_prefix_caching=False)
    prompts = mixed_prompts(llm.loaded.model.vocab_size, count=count)
    return [llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for prompt in prompts]


def assert_batch_invariant(model_dir: Path, alone: list[list[int]], settings: dict[str, Any]) -> None:
    """All prompts of `greedy_alone` together under ``settings`` (twice with prefix caching, the second
    run hitting the cache) give the same tokens, and every KV block is free afterwards."""
    llm = LLM(model_dir, **settings)
    prompts = mixed_prompts(llm.loaded.model.vocab_size, count=len(alone))
    for _ in range(2 if settings.get("enable_prefix_caching") else 1):
        outputs = llm.generate(prompts, GREEDY)
        for i, output in enumerate(outputs):
            assert output.outputs[0].token_ids == alone[i], f"{model_dir.name} prompt {i} ({len(prompts[i])} tokens)"
        assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks


def max_prompt_logprob_error(llm: LLM, fixture: str) -> float:
    """Largest |log-prob difference| between ``llm`` and fixture ``fixture``'s reference over every
    position of its four prompts (the quantity `test_model_parity` bounds by 1e-3)."""
    ref = reference(fixture)
    return max(
        float(np.abs(full_prompt_logprobs(llm, ref[f"prompt_{i}"].tolist()) - ref[f"logprobs_{i}"]).max())
        for i in range(4)
    )
