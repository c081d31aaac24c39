"""Hybrid models (gated delta net or Mamba-2 layers beside attention) on the cuda backend, with their
recurrent ops as kernels: the state follows each sequence through slot reuse, preemption, n > 1 forks
and prefix-cache hits restored from state snapshots (rows copied on the device), and each prompt gets
the greedy tokens it gets alone. Graph replay against eager decode, greedy batch invariance and the
logits against the numpy backend are in ``test_cuda_models.py``. Needs a CUDA GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core import LLM, SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import GREEDY, assert_no_leaks, greedy_alone, mixed_prompts
from atlas_core.testing.parity import full_prompt_logprobs

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))
REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

HYBRIDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h"]


def on_gpu() -> dict[str, Any]:
    """`LLM` settings for the cuda backend whose KV cache and recurrent state take 2 GiB more than what is in
    use, so that the tests' engines fit side by side (the default takes 90% of the device), in the
    batch-invariant mode (the tests compare tokens across batchings)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    share = min(1.0, (total - free + 2 * 2**30) / total)
    return {"backend": "cuda", "gpu_memory_utilization": share, "batch_invariant": True}


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(hybrid: str) -> list[list[int]]:
    """Each of 18 `mixed_prompts`' greedy tokens when it runs alone on the GPU."""
    return greedy_alone(TINY / hybrid, count=18, **on_gpu())


def test_slot_reuse_and_preemption_keep_outputs(
    hybrid: str, alone: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sequence slots for 18 prompts (every slot reused many times) and a KV cache far too small for
    the batch (preemption, some mid-prefill with 3-token chunks): each prompt's tokens are those alone."""
    probe = LLM(TINY / hybrid, block_size=4, max_seq_len=128, **on_gpu())
    state_bytes = 2 * 2 * probe.loaded.model.state_bytes_per_slot()  # 2 sequence slots + 2 snapshot slots
    budget = (160 * probe.engine.kv_plan.bytes_per_token + state_bytes) / 2**30
    monkeypatch.setattr(CudaBackend, "device_memory", lambda self: None)  # the KV cache gets kv_cache_memory_gib
    llm = LLM(
        TINY / hybrid,
        backend="cuda",
        block_size=4,
        max_seq_len=128,
        max_num_seqs=2,
        max_prefill_tokens=3,
        kv_cache_memory_gib=budget,
    )
    outputs = llm.generate(mixed_prompts(llm.loaded.model.vocab_size, count=18), GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    for i, output in enumerate(outputs):
        assert output.outputs[0].token_ids == alone[i], f"prompt {i}"
    assert_no_leaks(llm)


def test_prefix_cache_hit_equals_miss(hybrid: str) -> None:
    """A repeated prompt resumes from the state snapshot at its last block boundary, and a follow-up turn
    from the previous answer's; the tokens are those of a run without the cache."""
    block = 8
    llm = LLM(TINY / hybrid, block_size=block, **on_gpu())
    uncached = LLM(TINY / hybrid, block_size=block, enable_prefix_caching=False, **on_gpu())
    prompt = mixed_prompts(256, count=1)[0] + list(range(30))
    first = llm.generate(prompt, GREEDY)[0]
    again = llm.generate(prompt, GREEDY)[0]
    assert again.num_cached_tokens == (len(prompt) - 1) // block * block > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert first.outputs[0].token_ids == uncached.generate(prompt, GREEDY)[0].outputs[0].token_ids
    follow_up = prompt + first.outputs[0].token_ids + [9, 10, 11]
    hit = llm.generate(follow_up, GREEDY)[0]
    assert hit.num_cached_tokens > len(prompt)
    assert hit.outputs[0].token_ids == uncached.generate(follow_up, GREEDY)[0].outputs[0].token_ids
    assert len(llm.engine.scheduler.snapshots) > 0
    assert_no_leaks(llm)


def test_n_greater_than_one_forks_the_state(hybrid: str, alone: list[list[int]]) -> None:
    """n = 3 greedy completions fork from the prompt's state (copied to their slots on the device) and all
    equal the prompt's tokens alone."""
    llm = LLM(TINY / hybrid, max_num_seqs=4, **on_gpu())
    prompt = mixed_prompts(llm.loaded.model.vocab_size, count=18)[3]
    forked = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=3))[0]
    assert [c.token_ids for c in forked.outputs] == [alone[3]] * 3
    assert_no_leaks(llm)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5", "nemotron_h"])
def test_long_prompts_prefill_in_the_chunked_form(name: str) -> None:
    """Outside the batch-invariant mode a prompt of 64 tokens or more prefills its gated delta or Mamba-2 layers
    in the chunked form (tensor cores, 64 tokens at a time): its prompt log-probabilities stay within the bf16
    tolerance of `test_cuda_models.py` of the recurrent form's (the batch-invariant mode, itself checked against
    the numpy backend) at the median and the third quartile of the positions (a few positions move further: bf16
    flips a near tie of a tiny random model's router, and the recurrent state carries the flip on; measured 3.4
    at one of 415 positions of qwen3_next), and a follow-up decode carries the state on."""
    prompts = [[(7 * i + 3 * j) % 200 + 10 for j in range(length)] for i, length in enumerate((64, 150, 201))]
    recurrent = LLM(TINY / name, enable_prefix_caching=False, **on_gpu())
    chunked = LLM(TINY / name, enable_prefix_caching=False, **{**on_gpu(), "batch_invariant": False})
    drifts = []
    for prompt in prompts:
        got, want = full_prompt_logprobs(chunked, prompt), full_prompt_logprobs(recurrent, prompt)
        assert np.isfinite(got).all()
        drifts += [np.abs(g - w)[w > np.log(1e-3)].max() for g, w in zip(got, want, strict=True)]
    quartiles = np.percentile(drifts, [50, 75])
    assert quartiles[0] < 0.1 and quartiles[1] < 0.3, f"{name}: per-position drifts {np.round(drifts, 2).tolist()}"
    outputs = chunked.generate(prompts, GREEDY)
    assert all(len(output.outputs[0].token_ids) == GREEDY.max_tokens for output in outputs)
    assert_no_leaks(chunked)
