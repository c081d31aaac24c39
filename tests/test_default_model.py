"""The built-in default model, SmolLM2-135M-Instruct (GGUF Q4_1), end to end on the CPU."""

from __future__ import annotations

import numpy as np

from atlas_core import SamplingParams
from tests.conftest import FIXTURES


def test_greedy_chat_answers_paris(default_llm: object) -> None:
    output = default_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0, max_tokens=24)
    )[0]
    assert "Paris" in output.outputs[0].text
    assert output.outputs[0].finish_reason == "stop"


def test_prompt_logprobs_match_transformers_oracle(default_llm: object) -> None:
    """Top-20 next-token logprobs (dequantized Q4_1 weights, our tokenizer) at every prompt position agree with
    transformers' GGUF loader."""
    with np.load(FIXTURES / "smollm2_oracle.npz") as oracle:
        data = dict(oracle)
    prompt = data["prompt_ids"].tolist()
    output = default_llm.generate(
        prompt, SamplingParams(max_tokens=12, temperature=0, prompt_logprobs=20, ignore_eos=True)
    )[0]
    worst = 0.0
    for position in range(1, len(prompt)):
        ours = output.prompt_logprobs[position]
        top_ids, top_values = data["top_ids"][position - 1], data["top_logprobs"][position - 1]
        for token, value in zip(top_ids.tolist(), top_values.tolist(), strict=True):
            if token in ours:
                worst = max(worst, abs(ours[token].logprob - value))
        assert int(top_ids[0]) in ours and ours[int(top_ids[0])].rank == 1
    assert worst < 1e-3
    assert output.outputs[0].token_ids == data["greedy_ids"].tolist()


def test_seeded_sampling_is_reproducible(default_llm: object) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=1234)
    first = default_llm.generate("Tell me a story.", params)[0].outputs[0].token_ids
    again = default_llm.generate(["Another prompt here", "Tell me a story."], params)[1].outputs[0].token_ids
    assert first == again


def test_stop_string_ends_generation_without_the_stop_text(default_llm: object) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, stop=["Paris"])
    output = default_llm.chat([{"role": "user", "content": "What is the capital of France?"}], params)[0].outputs[0]
    assert output.finish_reason == "stop" and output.stop_reason == "Paris"
    assert "Paris" not in output.text and output.text.startswith("The capital of France is")
