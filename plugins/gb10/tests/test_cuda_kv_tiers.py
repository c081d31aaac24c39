"""The KV storage tiers on the cuda backend (`atlas_gb10.transfers.CudaHostTransfers`: gathers on the compute
stream, pinned copies on their own stream, uploads fenced by events): preemption by swap to host memory gives
the tokens of recompute preemption and of an unconstrained run (dense and hybrid), a prefix spilled to the host
tier hits with the tokens of a miss, and with persistence the device prefix cache written at close serves a
restarted engine; fp8 KV caches (E4M3 bytes) move through the tiers bit for bit too. Needs a CUDA GPU (the NVMe
test also the atlas-storage-nvme plugin)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core import LLM, SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import assert_no_leaks, mixed_prompts

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))
REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
ROOMY_GIB = 0.25
"""The KV cache of runs that never preempt nor evict (the tests' engines share the device)."""
PROMPTS_33 = [p + [1] * (33 - len(p)) for p in mixed_prompts(256, count=3, shared_length=0, max_tail_length=30, seed=3)]


def cuda_llm(name: str, tokens: int | None = None, **settings: object) -> LLM:
    """An engine on the GPU whose KV cache holds ``tokens`` tokens (beside two state slots per sequence on a
    hybrid model), or `ROOMY_GIB` when None; batch invariant, since the runs compared batch differently."""
    settings = {"batch_invariant": True, **settings}
    if tokens is None:
        return LLM(TINY / name, backend="cuda", kv_cache_memory_gib=ROOMY_GIB, **settings)
    probe = LLM(TINY / name, backend="cuda", kv_cache_memory_gib=1 / 64, **settings)
    state_bytes = 2 * probe.engine.config.max_num_seqs * probe.loaded.model.state_bytes_per_slot()
    budget = (tokens * probe.engine.kv_plan.bytes_per_token + state_bytes) / 2**30
    del probe
    return LLM(TINY / name, backend="cuda", kv_cache_memory_gib=budget, **settings)


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, GREEDY)]


CASES = [("llama", "auto"), ("qwen3_next", "auto"), ("llama", "fp8")]
"""(tiny checkpoint, kv_cache_dtype): dense and hybrid, and a cache of E4M3 bytes."""


@pytest.mark.parametrize(("name", "kv_cache_dtype"), CASES)
def test_swap_equals_recompute_equals_unconstrained(name: str, kv_cache_dtype: str) -> None:
    tight = {"block_size": 4, "max_seq_len": 128, "max_prefill_tokens": 3, "kv_cache_dtype": kv_cache_dtype}
    prompts = mixed_prompts(256)
    expected = greedy(cuda_llm(name, **tight), prompts)
    recompute = cuda_llm(name, 160, swap_space_gb=0.01, preemption_mode="recompute", **tight)
    assert greedy(recompute, prompts) == expected
    assert recompute.engine.scheduler.num_preemptions > 0
    swap = cuda_llm(name, 160, swap_space_gb=0.01, **tight)
    assert greedy(swap, prompts) == expected
    offload = swap.engine.offload
    assert offload is not None and offload.swap_outs > 0 and offload.swap_ins == offload.swap_outs
    offload.sync()
    assert offload.num_swapped == 0 and len(offload.loads) == 0
    assert_no_leaks(swap)


@pytest.mark.parametrize(("name", "kv_cache_dtype"), CASES)
def test_spilled_prefix_hit_equals_miss(name: str, kv_cache_dtype: str) -> None:
    expected = greedy(cuda_llm(name, enable_prefix_caching=False, kv_cache_dtype=kv_cache_dtype), PROMPTS_33)
    llm = cuda_llm(name, 48, block_size=4, max_seq_len=48, swap_space_gb=0.01, kv_cache_dtype=kv_cache_dtype)
    assert greedy(llm, PROMPTS_33) == expected
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [32, 32, 32]
    assert llm.engine.offload is not None and llm.engine.offload.spill_hit_tokens == 96
    assert_no_leaks(llm)


@pytest.mark.skipif(importlib.util.find_spec("atlas_storage_nvme") is None, reason="atlas-storage-nvme not installed")
def test_device_prefix_cache_written_at_close_serves_a_restart(tmp_path: Path) -> None:
    settings = {"block_size": 4, "max_seq_len": 48, "kv_spill_dir": str(tmp_path), "kv_spill_persist": True}
    expected = greedy(cuda_llm("llama", enable_prefix_caching=False), PROMPTS_33[:1])
    first = cuda_llm("llama", kv_spill_gb=0.01, **settings)
    assert greedy(first, PROMPTS_33[:1]) == expected
    first.close()
    restarted = cuda_llm("llama", kv_spill_gb=0.01, **settings)
    output = restarted.generate(PROMPTS_33[0], GREEDY)[0]
    assert output.outputs[0].token_ids == expected[0] and output.num_cached_tokens == 32
    restarted.close()
