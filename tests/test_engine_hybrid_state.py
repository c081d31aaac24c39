"""Engine invariants on hybrid models (gated delta net + attention, tiny Qwen3-Next / Qwen3.5 checkpoints):
recurrent state follows each sequence through chunked prefill, batching, slot reuse, preemption, n > 1
forks, and prefix-cache hits restored from state snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.errors import InvalidRequestError
from atlas_core.testing.family import GREEDY, assert_batch_invariant, assert_no_leaks, greedy_alone, mixed_prompts
from tests.conftest import TINY, reference

HYBRIDS = ["qwen3_next", "qwen3_5", "nemotron_h"]
TOP = 20  # logprobs compared per position: the chosen token and the 20 most likely


def scored(llm: LLM, prompt: list[int]) -> tuple[list[dict[int, float]], list[int], list[dict[int, float]]]:
    """Prompt logprobs (top 20 + chosen per position), greedy tokens, and their decode logprobs."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP)
    output = llm.generate(prompt, params)[0]
    prompt_rows = [{t: lp.logprob for t, lp in row.items()} for row in output.prompt_logprobs[1:]]
    completion = output.outputs[0]
    return prompt_rows, completion.token_ids, [{t: lp.logprob for t, lp in row.items()} for row in completion.logprobs]


@pytest.mark.parametrize("name", HYBRIDS)
@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_chunked_prefill_gives_one_shot_logits(name: str, chunk: int) -> None:
    """Prefill in chunks of 1, 3 and 16 tokens: every prompt position's logprobs equal the one-shot
    prefill's (and transformers'), and so do the greedy tokens and their decode logprobs."""
    ref = reference(name)
    prompt = ref["prompt_3"].tolist()  # 150 tokens: the chunked form crosses two 64-token chunks
    one_shot = scored(LLM(TINY / name, max_num_batched_tokens=256), prompt)
    chunked = scored(LLM(TINY / name, max_num_batched_tokens=chunk), prompt)
    assert chunked[1] == one_shot[1] == ref["greedy_3"].tolist()
    for rows_chunked, rows_one_shot in ((chunked[0], one_shot[0]), (chunked[2], one_shot[2])):
        assert len(rows_chunked) == len(rows_one_shot)
        for row_c, row_o in zip(rows_chunked, rows_one_shot, strict=True):
            assert row_c.keys() == row_o.keys()
            np.testing.assert_allclose([row_c[t] for t in row_o], list(row_o.values()), atol=1e-4, rtol=0)
    for position, row in enumerate(chunked[0]):
        for token, logprob in row.items():
            assert logprob == pytest.approx(ref["logprobs_3"][position, token], abs=1e-3)


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(hybrid: str) -> list[list[int]]:
    """Each of the 18 `mixed_prompts`' greedy tokens when it runs alone, without prefix caching or chunking."""
    return greedy_alone(TINY / hybrid, count=18)


@pytest.mark.parametrize(
    "settings",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": True},
        {"enable_prefix_caching": True, "max_num_batched_tokens": 7},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
        {"enable_prefix_caching": True, "max_num_seqs": 2, "block_size": 4},
    ],
    ids=["batched", "prefix-cache", "tiny-budget", "tiny-chunks", "two-slots-small-blocks"],
)
def test_state_never_leaks_between_sequences(hybrid: str, alone: list[list[int]], settings: dict) -> None:
    """Greedy tokens are those of each prompt alone, however prompts are batched and chunked, whatever
    slot a sequence reuses after another finished, and on prefix-cache hits (second run)."""
    # with 2 sequence slots the snapshot pool has 2 slots too: 18 prompts evict each other's state
    hits = settings["enable_prefix_caching"] and "max_num_seqs" not in settings
    assert_batch_invariant(TINY / hybrid, alone, settings, expect_cache_hits=hits)


def test_preemption_mid_prefill_keeps_outputs(hybrid: str, alone: list[list[int]]) -> None:
    """A KV cache far too small for the batch preempts sequences (some mid-prefill, with 3-token chunks);
    they restart from a fresh state slot and still produce the tokens they produce alone."""
    probe = LLM(TINY / hybrid, block_size=4, max_seq_len=128)
    state_bytes = 2 * probe.engine.config.max_num_seqs * probe.loaded.model.state_bytes_per_slot()
    budget = (160 * probe.engine.kv_plan.bytes_per_token + state_bytes) / 2**30
    llm = LLM(TINY / hybrid, block_size=4, max_seq_len=128, kv_cache_memory_gib=budget, max_prefill_tokens=3)
    prompts = mixed_prompts(llm.loaded.model.vocab_size)
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    for i, output in enumerate(outputs):
        assert output.outputs[0].token_ids == alone[i], f"prompt {i}"
    assert_no_leaks(llm)


def test_prefix_cache_hit_equals_miss(hybrid: str) -> None:
    """Reuse happens exactly at block boundaries whose recurrent state was saved: the last boundary of a
    prompt, and a finished sequence's last boundary (multi-turn); hits give the tokens of a miss."""
    block = 8
    llm = LLM(TINY / hybrid, block_size=block)
    uncached = LLM(TINY / hybrid, block_size=block, enable_prefix_caching=False)
    prompt = mixed_prompts(256, count=1)[0] + list(range(30))
    boundary = (len(prompt) - 1) // block * block  # the prompt's snapshot: its last block boundary
    first = llm.generate(prompt, GREEDY)[0]
    again = llm.generate(prompt, GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == boundary
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    # diverging before that boundary: the shared blocks are cached, but no state was saved at their end
    diverged = prompt[: boundary - 3] + [5, 6, 7, 8, 9]
    miss = llm.generate(diverged, GREEDY)[0]
    assert miss.num_cached_tokens == 0
    assert miss.outputs[0].token_ids == uncached.generate(diverged, GREEDY)[0].outputs[0].token_ids
    # multi-turn: the next prompt extends prompt + answer; the answer's last saved boundary is reused
    answer = first.outputs[0].token_ids
    follow_up = prompt + answer + [9, 10, 11]
    computed = len(prompt) + len(answer) - 1  # the last sampled token was never run through the model
    hit = llm.generate(follow_up, GREEDY)[0]
    assert hit.num_cached_tokens == computed // block * block > len(prompt)
    assert hit.outputs[0].token_ids == uncached.generate(follow_up, GREEDY)[0].outputs[0].token_ids
    assert len(llm.engine.scheduler.snapshots) > 0
    assert_no_leaks(llm)


def test_n_greater_than_one_forks_the_state(hybrid: str, alone: list[list[int]]) -> None:
    """n > 1 completions fork from the first one's state after the prompt: greedy forks all equal the
    prompt's tokens alone; seeded samples of completion 0 match an n = 1 request with the same seed."""
    llm = LLM(TINY / hybrid, max_num_seqs=4)
    prompt = mixed_prompts(llm.loaded.model.vocab_size)[3]
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=3))[0]
    assert [c.token_ids for c in greedy.outputs] == [alone[3]] * 3
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=11)
    forked = llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=11, n=2))[0]
    assert forked.outputs[0].token_ids == llm.generate(prompt, sampled)[0].outputs[0].token_ids
    assert_no_leaks(llm)
    with pytest.raises(InvalidRequestError, match="max_num_seqs"):
        llm.engine.add_request("too-many", None, prompt, SamplingParams(n=5))


def test_no_state_snapshots_means_no_prefix_reuse_on_hybrids() -> None:
    """``max_state_snapshots=0``: a hybrid model cannot restore state, so a repeated prompt is
    recomputed in full (no cached tokens) and gives the same tokens."""
    llm = LLM(TINY / "qwen3_5", backend="numpy", max_state_snapshots=0)
    assert llm.engine.scheduler.snapshots is None
    prompt = reference("qwen3_5")["prompt_3"].tolist()
    first, second = (llm.generate(prompt, GREEDY)[0] for _ in range(2))
    assert second.num_cached_tokens == 0
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
