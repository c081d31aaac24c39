"""Engine APIs against the tiny checkpoints' references: the ``prompt_logprobs`` request option and
chunked prefill. (Each family plugin checks the parity of its own checkpoints with
`atlas_core.testing.parity.ReferenceParity`.)
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.testing.parity import TOLERANCE
from tests.conftest import TINY, reference


def test_prompt_logprobs_api_agrees_with_full_rows() -> None:
    """``prompt_logprobs`` reports each prompt token's own logprob and the top alternatives, ranked."""
    llm, ref = TINY.shared_llm("qwen3"), reference("qwen3")
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


def test_chunked_prefill_matches_one_shot() -> None:
    """A prompt prefilled in 5-token chunks gives the same greedy tokens as in one step."""
    ref = reference("llama")
    chunked = LLM(TINY / "llama", max_num_batched_tokens=5)
    prompt = ref["prompt_3"].tolist()
    output = chunked.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    assert output.outputs[0].token_ids == ref["greedy_3"].tolist()
