"""Preemption by swap to the host-memory tier: KV blocks and recurrent states round-trip bit-exact, and
a run that swaps gives the outputs of one that recomputes and of one that never preempts."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.engine.config import EngineConfig
from atlas_core.errors import ConfigError
from atlas_core.testing.family import assert_no_leaks, mixed_prompts
from tests.conftest import TINY

SCORED = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
LOGPROB_TOLERANCE = {"llama": 1e-5, "qwen3_next": 5e-5}
"""Swapping restores KV and state bit-exact (`tests/test_kv_tiers.py`), but a preempted run batches its
sequences differently from an unconstrained one, and float32 matmuls over other batch shapes differ in the
last bits: recompute preemption differs from the unconstrained run by the same 2-3e-6 on the dense tiny
model and about 2e-5 on the hybrid one."""


def tight_engine(name: str, **settings: object) -> LLM:
    """An engine whose KV cache holds 160 tokens: the 18 `mixed_prompts` preempt each other."""
    probe = LLM(TINY / name, block_size=4, max_seq_len=128)
    state_bytes = 2 * probe.engine.config.max_num_seqs * probe.loaded.model.state_bytes_per_slot()
    budget = (160 * probe.engine.kv_plan.bytes_per_token + state_bytes) / 2**30
    return LLM(TINY / name, block_size=4, max_seq_len=128, kv_cache_memory_gib=budget, max_prefill_tokens=3, **settings)


def assert_same_outputs(expected: list, actual: list, tolerance: float) -> None:
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids, f"prompt {i}"
        for row_want, row_got in zip(want.outputs[0].logprobs, got.outputs[0].logprobs, strict=True):
            assert row_got.keys() == row_want.keys()
            np.testing.assert_allclose(
                [row_got[t].logprob for t in row_want], [e.logprob for e in row_want.values()], atol=tolerance, rtol=0
            )


def assert_nothing_held(llm: LLM) -> None:
    """No block, slot, load or swapped record is held: what stays in the tiers is spilled prefixes (and their
    state snapshots), none pinned."""
    assert_no_leaks(llm)
    offload = llm.engine.offload
    assert offload is not None
    offload.sync()
    assert offload.num_swapped == 0 and len(offload.loads) == 0 and offload.store.num_pinned == 0
    if offload.state_store is not None:
        assert offload.state_store.num_pinned == 0


@pytest.mark.parametrize("name", ["llama", "qwen3_next"])
def test_swap_equals_recompute_equals_unconstrained(name: str) -> None:
    """Dense and hybrid (gated delta net) models: swapped sequences come back with their KV and recurrent
    state and continue where they were; greedy tokens equal and logprobs agree with both other runs."""
    unconstrained = LLM(TINY / name, block_size=4, max_seq_len=128, max_prefill_tokens=3)
    prompts = mixed_prompts(unconstrained.loaded.model.vocab_size)
    expected = unconstrained.generate(prompts, SCORED)
    recompute = tight_engine(name, swap_space_gb=0.01, preemption_mode="recompute")
    recomputed = recompute.generate(prompts, SCORED)
    swap = tight_engine(name, swap_space_gb=0.01)
    swapped = swap.generate(prompts, SCORED)
    offload = swap.engine.offload
    assert offload is not None and offload.swap_outs > 0 and offload.swap_ins == offload.swap_outs
    assert recompute.engine.offload is not None and recompute.engine.offload.swap_outs == 0
    assert recompute.engine.scheduler.num_preemptions > 0
    assert_same_outputs(expected, swapped, LOGPROB_TOLERANCE[name])
    assert_same_outputs(recomputed, swapped, LOGPROB_TOLERANCE[name])
    assert_nothing_held(swap)


def test_swap_without_room_recomputes() -> None:
    """A host tier too small for any preempted sequence: preemption recomputes, outputs unchanged."""
    reference = tight_engine("llama").generate(mixed_prompts(256), SCORED)
    llm = tight_engine("llama", swap_space_gb=1e-6)
    assert llm.engine.offload is not None and llm.engine.offload.store.capacities()["host"] < 4
    assert_same_outputs(reference, llm.generate(mixed_prompts(256), SCORED), LOGPROB_TOLERANCE["llama"])
    assert llm.engine.offload.swap_outs == 0 and llm.engine.scheduler.num_preemptions > 0
    assert_nothing_held(llm)


def test_lost_swap_record_recomputes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records that cannot be read back (as a corrupt disk block's) make their sequences recompute: same outputs."""
    llm = tight_engine("llama", swap_space_gb=0.01)
    tier = llm.engine.offload.store._tiers[0].backend  # type: ignore[union-attr]
    monkeypatch.setattr(tier, "read", lambda slots, out: list(slots))
    reference = tight_engine("llama").generate(mixed_prompts(256), SCORED)
    assert_same_outputs(reference, llm.generate(mixed_prompts(256), SCORED), LOGPROB_TOLERANCE["llama"])
    offload = llm.engine.offload
    assert offload is not None and offload.swap_lost > 0 and offload.swap_ins == 0
    assert_nothing_held(llm)


def test_abort_while_swapped_out_frees_its_records() -> None:
    llm = tight_engine("llama", swap_space_gb=0.01)
    engine = llm.engine
    for i, prompt in enumerate(mixed_prompts(256)):
        engine.add_request(str(i), None, prompt, SCORED)
    while engine.offload is not None and engine.offload.num_swapped == 0:
        engine.step()
    for request_id in list(engine.requests):
        engine.abort(request_id)
    assert_nothing_held(llm)


def test_failed_step_while_swapped_out_leaves_nothing_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward that raises fails the requests in its step; the swapped-out ones come back and finish, and
    afterwards no block, slot or record is held."""
    llm = tight_engine("llama", swap_space_gb=0.01)
    engine = llm.engine
    requests = [engine.add_request(str(i), None, prompt, SCORED) for i, prompt in enumerate(mixed_prompts(256))]
    while engine.offload is not None and engine.offload.num_swapped == 0:
        engine.step()

    def fail(*args: object) -> None:
        raise RuntimeError("device lost")

    with monkeypatch.context() as patch:
        patch.setattr(engine.runner, "execute", fail)
        engine.step()
    while engine.has_unfinished():
        engine.step()
    failed = [r for r in requests if r.error is not None]
    assert failed and len(failed) < len(requests) and engine.offload.swap_ins > 0
    assert_nothing_held(llm)


def test_swap_needs_a_tier() -> None:
    with pytest.raises(ConfigError, match="swap_space_gb"):
        EngineConfig(preemption_mode="swap")
    with pytest.raises(ConfigError, match="swap_space_gb must be at least 0"):
        EngineConfig(swap_space_gb=-1)
