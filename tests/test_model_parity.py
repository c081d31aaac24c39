"""Logit parity with Hugging Face transformers on tiny random checkpoints (references in fixtures).

Every prompt position's full log-softmax row must match within 1e-3 (fp32), the greedy
continuation must be identical, and each decode step (KV cache in use) must match too.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import SamplingParams
from tests.conftest import TINY_NAMES, reference

TOLERANCE = 1e-3


def full_prompt_logprobs(llm: object, prompt: list[int]) -> np.ndarray:
    """``[T, V]`` log-softmax of every prompt position, from one prefill through the engine's runner."""
    engine = llm.engine
    # prompt_logprobs: no prefix-cache reuse and no chunk cut at a state-snapshot boundary, so one step runs it all
    engine.add_request("score", None, prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    try:
        step = engine.scheduler.schedule()
        batch, _ = engine.runner.build_batch(step.chunks)
        model, backend = engine.runner.model, engine.backend
        hidden = model.forward(batch, engine.kv)
        return backend.to_numpy(backend.log_softmax(model.compute_logits(hidden)))
    finally:
        engine.abort("score")


@pytest.mark.parametrize("name", TINY_NAMES)
def test_prompt_logprobs_match_transformers(tiny_llms: dict, name: str) -> None:
    ref = reference(name)
    for i in range(4):
        ours = full_prompt_logprobs(tiny_llms[name], ref[f"prompt_{i}"].tolist())
        np.testing.assert_allclose(ours, ref[f"logprobs_{i}"], atol=TOLERANCE, rtol=0, err_msg=f"{name} prompt {i}")


@pytest.mark.parametrize("name", TINY_NAMES)
def test_greedy_decode_matches_transformers(tiny_llms: dict, name: str) -> None:
    ref = reference(name)
    prompts = [ref[f"prompt_{i}"].tolist() for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    outputs = tiny_llms[name].generate(prompts, params)  # all four prompts batched together
    for i, output in enumerate(outputs):
        completion = output.outputs[0]
        assert completion.token_ids == ref[f"greedy_{i}"].tolist(), f"{name} prompt {i}"
        expected = ref[f"greedy_logprobs_{i}"]
        got = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
        want = [expected[j, token] for j, token in enumerate(completion.token_ids)]
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0, err_msg=f"{name} prompt {i}")


def test_prompt_logprobs_api_agrees_with_full_rows(tiny_llms: dict) -> None:
    """``prompt_logprobs`` reports each prompt token's own logprob and the top alternatives, ranked."""
    llm, ref = tiny_llms["qwen3"], reference("qwen3")
    prompt = ref["prompt_2"].tolist()
    output = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=3))[0]
    assert output.prompt_logprobs[0] is None
    rows = ref["logprobs_2"]
    for position in range(1, len(prompt)):
        entry = output.prompt_logprobs[position]
        row = rows[position - 1]
        token = prompt[position]
        assert entry[token].logprob == pytest.approx(row[token], abs=TOLERANCE)
        assert entry[token].rank == 1 + int(np.sum(row > row[token] + 1e-6))
        top3 = [t for t, lp in entry.items() if lp.rank <= 3]
        assert sorted(top3) == sorted(np.argsort(-row)[:3].tolist())


def test_chunked_prefill_matches_one_shot(tiny_llms: dict) -> None:
    """A prompt prefilled in 5-token chunks gives the same greedy tokens as in one step."""
    from atlas_core import LLM
    from tests.conftest import TINY

    ref = reference("llama")
    chunked = LLM(TINY / "llama", max_num_batched_tokens=5)
    prompt = ref["prompt_3"].tolist()
    output = chunked.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    assert output.outputs[0].token_ids == ref["greedy_3"].tolist()
