"""Prefix-cache spill: full blocks the device prefix cache evicts go to the storage tiers under their chained
hash; a prompt that returns loads them instead of recomputing them, with the outputs of a cache miss."""

from __future__ import annotations

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.server.metrics import ServerMetrics
from atlas_core.testing.family import assert_no_leaks, mixed_prompts
from tests.conftest import TINY

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
BLOCK = 4


def small_cache(name: str = "llama", **settings: object) -> LLM:
    """An engine whose device KV cache holds 48 tokens: each of the `conversations` evicts the others (on a
    hybrid model, beside room for its recurrent state slots and snapshots)."""
    probe = LLM(TINY / name, block_size=BLOCK, max_seq_len=48)
    state_bytes = 2 * probe.engine.config.max_num_seqs * probe.loaded.model.state_bytes_per_slot()
    budget = (48 * probe.engine.kv_plan.bytes_per_token + state_bytes) / 2**30
    return LLM(TINY / name, block_size=BLOCK, max_seq_len=48, kv_cache_memory_gib=budget, **settings)


def conversations() -> list[list[int]]:
    return mixed_prompts(256, count=3, shared_length=0, max_tail_length=30, seed=3)


PROMPTS_33 = [p + [1] * (33 - len(p)) for p in conversations()]  # 8 full blocks reusable each


def tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for prompt in prompts]


def test_spilled_prefix_hit_equals_miss() -> None:
    """Three conversations take turns in a device cache that holds one: the second round finds every
    prefix in the host tier, loads it (num_cached_tokens counts it), and answers as without any cache."""
    prompts = PROMPTS_33
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), prompts)
    llm = small_cache(swap_space_gb=0.01)
    offload = llm.engine.offload
    assert offload is not None
    assert tokens(llm, prompts) == expected
    device_hits = llm.engine.blocks.prefix_cache_hit_tokens
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in prompts]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [32, 32, 32]
    assert offload.spill_hit_tokens == 96 and llm.engine.blocks.prefix_cache_hit_tokens == device_hits
    assert_no_leaks(llm)
    metrics = ServerMetrics()
    metrics.watch_engine(llm.engine)
    text = metrics.render().decode()
    assert 'atlas_kv_spill_hit_tokens_total{model_name=""} 96.0' in text
    assert f'atlas_prefix_cache_hit_tokens_total{{model_name=""}} {float(device_hits)}' in text


def test_hybrid_spilled_prefix_with_its_state_snapshot_equals_miss() -> None:
    """A hybrid (gated delta net) model: the state snapshot taken at a prefix's last full block leaves the device
    with that block and comes back with it into the sequence's state slot; the answers are a cache miss's (they
    are not without the state: the recurrent layers would start from the wrong one)."""
    expected = tokens(LLM(TINY / "qwen3_next", enable_prefix_caching=False), PROMPTS_33)
    llm = small_cache("qwen3_next", swap_space_gb=0.01)
    assert tokens(llm, PROMPTS_33) == expected
    offload = llm.engine.offload
    assert offload is not None and offload.state_store is not None and len(offload.state_store) > 0
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [32, 32, 32]
    assert offload.spill_hit_tokens == 96 and offload.spill_lost_blocks == 0
    assert_no_leaks(llm)


def test_without_tiers_the_evicted_prefix_is_recomputed() -> None:
    prompts = PROMPTS_33
    llm = small_cache()
    tokens(llm, prompts)
    assert [llm.generate(prompt, GREEDY)[0].num_cached_tokens for prompt in prompts] == [0, 0, 0]


def test_corrupt_spilled_block_is_recomputed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spilled block whose token ids do not match the prompt (as a corrupted or colliding record would) is
    dropped: the hit stops before it and the rest is recomputed, with the same outputs."""
    prompts = PROMPTS_33
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), prompts)
    llm = small_cache(swap_space_gb=0.01)
    tokens(llm, prompts)
    tier = llm.engine.offload.store._tiers[0].backend  # type: ignore[union-attr]
    real_read = tier.read

    def corrupt_third(slots: list, out: list) -> list:
        lost = real_read(slots, out)
        if len(slots) > 2:
            out[-1][2, 1] += 1  # the token ids stored with the third block
        return lost

    monkeypatch.setattr(tier, "read", corrupt_third)
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in prompts]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [8, 8, 8]
    assert_no_leaks(llm)


def test_tier_read_that_raises_loses_its_records_not_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error reading records back (not an OSError) counts as their loss: the prefix is recomputed
    and every request answers as a cache miss."""
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    llm = small_cache(swap_space_gb=0.01)
    tokens(llm, PROMPTS_33)
    tier = llm.engine.offload.store._tiers[0].backend  # type: ignore[union-attr]

    def broken(slots: list, out: list) -> list:
        raise RuntimeError("the tier's reader broke")

    monkeypatch.setattr(tier, "read", broken)
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.engine.offload is not None and llm.engine.offload.spill_lost_blocks > 0
    assert_no_leaks(llm)


def test_one_token_requests_leave_their_prefix_cached() -> None:
    """A request that finishes on its prefill step (max_tokens=1) still files its prompt's full blocks in the
    prefix cache, so a returning prompt hits them on the device and, once evicted, in the tier."""
    one = SamplingParams(temperature=0, max_tokens=1)
    llm = small_cache(swap_space_gb=0.01)
    for prompt in PROMPTS_33:
        llm.generate(prompt, one)
    outputs = [llm.generate(prompt, one)[0] for prompt in PROMPTS_33]
    assert [o.num_cached_tokens for o in outputs] == [32, 32, 32]
    offload = llm.engine.offload
    assert offload is not None and offload.spill_hit_tokens > 0
    assert_no_leaks(llm)
