"""Engine invariants every model family must keep, checked on its tiny checkpoints.

A sequence's greedy tokens are the same alone or batched with others, with chunked prefill, with
prefix caching and with tiny blocks, and every KV block and recurrent-state slot is free again
afterwards. Family plugins call these with their own checkpoint folders (core's tests with the
checkpoints they borrow); `INVARIANCE_SETTINGS` are the engine settings to try.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core import LLM, SamplingParams
from atlas_core.engine.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
"""Twelve greedy tokens, EOS ignored: the completion every invariance check compares."""

INVARIANCE_SETTINGS: dict[str, dict[str, Any]] = {
    "batched": {"enable_prefix_caching": False},
    "prefix-cache": {"enable_prefix_caching": True},
    "tiny-chunks": {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
    "tiny-budget-small-blocks": {"enable_prefix_caching": True, "max_num_batched_tokens": 7, "block_size": 4},
}
"""Engine settings whose greedy outputs must equal each prompt's output alone (keyed by test id)."""


def mixed_prompts(
    vocab: int, count: int = 18, seed: int = 7, *, shared_length: int = 40, max_tail_length: int = 89
) -> list[list[int]]:
    """``count`` random prompts over ``vocab`` tokens with tails of 1 to ``max_tail_length`` tokens;
    every third (0, 3, ...) starts with the same ``shared_length`` tokens (prefix-cache hits)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, vocab, shared_length).tolist()
    prompts = []
    for i in range(count):
        length = int(rng.integers(1, max_tail_length + 1))
        tail = rng.integers(0, vocab, length).tolist()
        prompts.append(shared + tail if i % 3 == 0 else tail)
    return prompts


def assert_no_leaks(llm: LLM) -> None:
    """Every KV block is free again, and so is every recurrent-state slot of a model that has them."""
    engine = llm.engine
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    if llm.loaded.model.has_recurrent_state:
        assert engine.state_slots is not None and engine.state_slots.num_free == engine.state_slots.num_slots


def greedy_alone(
    model_dir: Path, count: int = 12, prompts: list[list[int]] | None = None, **engine_args: Any
) -> list[list[int]]:
    """The greedy tokens of each prompt run alone (one after another, without prefix caching):
    ``prompts``, or ``count`` `mixed_prompts` over the model's vocabulary. ``engine_args`` go to `LLM`."""
    llm = LLM(model_dir, enable_prefix_caching=False, **engine_args)
    if prompts is None:
        prompts = mixed_prompts(llm.loaded.model.vocab_size, count=count)
    return [llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for prompt in prompts]


def assert_batch_invariant(
    model_dir: Path,
    alone: list[list[int]],
    settings: dict[str, Any],
    *,
    prompts: list[list[int]] | None = None,
    expect_cache_hits: bool | None = None,
    **engine_args: Any,
) -> None:
    """All prompts of `greedy_alone` together under ``settings`` (and ``engine_args``) give the same
    tokens as alone, and leave nothing held (`assert_no_leaks`). With prefix caching they run twice,
    the second run hitting the cache the first filled; ``expect_cache_hits`` (default: whenever
    ``settings`` enable prefix caching) also requires that run to report cached tokens.
    ``prompts``: those given to `greedy_alone` (default: the `mixed_prompts` it made)."""
    llm = LLM(model_dir, **settings, **engine_args)
    if prompts is None:
        prompts = mixed_prompts(llm.loaded.model.vocab_size, count=len(alone))
    caching = bool(settings.get("enable_prefix_caching"))
    for _ in range(2 if caching else 1):
        outputs = llm.generate(prompts, GREEDY)
        for i, output in enumerate(outputs):
            assert output.outputs[0].token_ids == alone[i], f"{model_dir.name} prompt {i} ({len(prompts[i])} tokens)"
        assert_no_leaks(llm)
    if expect_cache_hits is None:
        expect_cache_hits = caching
    if expect_cache_hits:
        assert sum(output.num_cached_tokens for output in outputs) > 0
        assert llm.engine.blocks.hit_rate > 0


def step_requests(
    engine: Any,
    requests: list[tuple[list[int], SamplingParams]],
    *,
    first: int | None = None,
    on_step: Callable[[Any, int], None] | None = None,
    min_steps: int = 0,
) -> dict[str, RequestOutput]:
    """Add the first ``first`` of ``requests`` (all by default) to ``engine`` (an `LLMEngine`) as requests "0",
    "1", ..., then step it until nothing is unfinished and at least ``min_steps`` steps ran, calling
    ``on_step(engine, step)`` before each step (to add or abort requests on the way). Each request's last
    output, by id."""
    for index, (prompt, params) in enumerate(requests[:first]):
        engine.add_request(str(index), None, prompt, params)
    outputs: dict[str, RequestOutput] = {}
    step = 0
    while engine.has_unfinished() or step < min_steps:
        if on_step is not None:
            on_step(engine, step)
        for output in engine.step():
            outputs[output.request_id] = output
        step += 1
    return outputs
