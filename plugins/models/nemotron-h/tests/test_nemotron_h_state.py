"""Nemotron-H's recurrent state in the engine: a prompt prefilled in chunks of any size gives the
one-shot logits, and a sequence's greedy tokens do not depend on what runs beside it (other
sequences finishing and handing their state slots on, preemption in the middle of a prefill,
prefix-cache state snapshots)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.engine.sequence import Sequence
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import GREEDY, assert_batch_invariant, assert_no_leaks, greedy_alone, mixed_prompts

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
MODEL = TINY / "nemotron_h"
PROMPTS = mixed_prompts(256, count=14, seed=11, shared_length=33, max_tail_length=69)
"""Fourteen prompts of 1 to 69 own tokens; every third is prefixed by the same 33 tokens (prefix-cache hits)."""


def prompt_rows(llm: LLM, prompt: list[int]) -> list[dict[int, float]]:
    """Top-20 log-probabilities of every prompt position after the first, and the position's own token."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=20)
    output = llm.generate(prompt, params)[0]
    return [{token: entry.logprob for token, entry in position.items()} for position in output.prompt_logprobs[1:]]


@pytest.fixture(scope="module")
def one_shot() -> dict[int, list[dict[int, float]]]:
    llm = LLM(MODEL)
    ref = TINY.reference("nemotron_h")
    return {i: prompt_rows(llm, ref[f"prompt_{i}"].tolist()) for i in (2, 3)}


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_chunked_prefill_gives_the_one_shot_logits(one_shot: dict[int, list[dict[int, float]]], chunk: int) -> None:
    ref = TINY.reference("nemotron_h")
    llm = LLM(MODEL, max_num_batched_tokens=chunk)
    for i in (2, 3):  # 19 and 40 tokens: chunks cross the scan's 16-token chunks at every offset
        prompt = ref[f"prompt_{i}"].tolist()
        rows = prompt_rows(llm, prompt)
        for position, (got, want) in enumerate(zip(rows, one_shot[i], strict=True)):
            assert got.keys() == want.keys(), f"prompt {i} position {position + 1}"
            np.testing.assert_allclose([got[t] for t in want], list(want.values()), atol=1e-5, rtol=0)
            hf_row = ref[f"logprobs_{i}"][position]  # row p predicts token p + 1
            np.testing.assert_allclose([got[t] for t in want], hf_row[list(want)], atol=1e-3, rtol=0)
        output = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
        assert output.outputs[0].token_ids == ref[f"greedy_{i}"].tolist(), f"prompt {i}, chunks of {chunk}"


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    """Each prompt's greedy tokens when it runs by itself (one after another, so slots are reused)."""
    return greedy_alone(MODEL, prompts=PROMPTS)


@pytest.mark.parametrize(
    "settings",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
        {"enable_prefix_caching": False, "max_num_seqs": 3},
        {"enable_prefix_caching": True, "block_size": 8},
    ],
    ids=["batched", "tiny-chunks", "slots-handed-on", "prefix-cache-snapshots"],
)
def test_greedy_tokens_are_batch_invariant(alone: list[list[int]], settings: dict) -> None:
    # the second run with prefix caching starts from the first one's state snapshots
    assert_batch_invariant(MODEL, alone, settings, prompts=PROMPTS)


def test_preemption_in_the_middle_of_a_prefill_keeps_outputs(alone: list[list[int]]) -> None:
    """A KV cache of about 130 tokens for 14 sequences forces preemption by recompute, some of it while
    the victim's prompt is still being prefilled in 5-token chunks; its state slot goes to others and
    it restarts from zeroed state."""
    bytes_per_token = 2 * 2 * 16 * 4  # one attention layer: K and V, 2 heads of 16, float32
    slots = 16  # the recurrent state of every slot comes out of the same budget
    state_bytes = slots * LLM(MODEL, max_num_seqs=1).loaded.model.state_bytes_per_slot()
    llm = LLM(
        MODEL,
        block_size=4,
        max_seq_len=128,
        max_prefill_tokens=5,
        enable_prefix_caching=False,
        max_num_seqs=slots,
        kv_cache_memory_gib=(state_bytes + 130 * bytes_per_token) / 2**30,
    )
    scheduler = llm.engine.scheduler
    mid_prefill: list[bool] = []
    preempt = scheduler.preempt

    def recording_preempt(seq: Sequence, *pending_copies: list[tuple[int, int]] | None) -> None:
        mid_prefill.append(0 < seq.num_computed < seq.num_prompt_tokens)
        preempt(seq, *pending_copies)

    scheduler.preempt = recording_preempt  # type: ignore[method-assign]
    outputs = llm.generate(PROMPTS, GREEDY)
    assert any(mid_prefill), f"no preemption hit a sequence mid-prefill ({len(mid_prefill)} preemptions)"
    for i, output in enumerate(outputs):
        assert output.outputs[0].token_ids == alone[i], f"prompt {i}"
    assert_no_leaks(llm)
