"""Speculative decoding with the checkpoint's MTP layers (method ``mtp``) on the hybrid MoE tiny checkpoints:
outputs equal plain decoding's, incremental drafts equal a fresh engine's, preemption, and the refusal of
a checkpoint without MTP layers. (The head's logits against transformers: the qwen3-next plugin's tests.)"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.mtp import MtpProposer
from atlas_core.errors import ConfigError
from atlas_core.testing.family import assert_no_leaks, mixed_prompts
from tests.conftest import TINY
from tests.test_speculative_decoding import GREEDY, outputs_of, tight_kv_gib

MTP = {"method": "mtp", "num_speculative_tokens": 2}


class RecordedDrafts:
    """Wraps an `MtpProposer`'s `propose`: the drafts it gave, by the sequence's tokens at the time."""

    def __init__(self, proposer: MtpProposer) -> None:
        self.proposer, self.drafts = proposer, {}
        self.original = proposer.propose
        proposer.propose = self.propose  # type: ignore[method-assign]

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        out = self.original(seqs, max_tokens)
        for seq, draft in zip(seqs, out, strict=True):
            self.drafts[tuple(seq.token_ids)] = draft
        return out


def mtp_llm(name: str, **kwargs: object) -> tuple[LLM, RecordedDrafts]:
    llm = LLM(TINY / name, speculative_config=MTP, **kwargs)  # type: ignore[arg-type]
    assert llm.engine.speculation is not None and isinstance(llm.engine.speculation.proposer, MtpProposer)
    return llm, RecordedDrafts(llm.engine.speculation.proposer)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_mtp_greedy_identical_and_drafts_equal_a_fresh_computation(name: str) -> None:
    """MTP speculation on the hybrid MoE checkpoints (batched; every step's drafts verified and, with
    random MTP weights, mostly rejected, so the recurrent state rolls back): the tokens equal plain
    decoding's, with and without prefix-cache hits; the drafts made incrementally (MTP KV kept across
    steps, provisional entries overwritten, positions recomputed after rollbacks) equal those of a fresh
    engine that gets the same tokens as one prompt; nothing is left behind."""
    plain = LLM(TINY / name, enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=6, max_tail_length=40)
    want = outputs_of(plain, prompts, GREEDY)
    cached, _ = mtp_llm(name, block_size=4)
    for _ in range(2):  # the second run hits the prefix cache the first filled
        assert outputs_of(cached, prompts, GREEDY) == want
        assert_no_leaks(cached)
    spec, recorded = mtp_llm(name, block_size=4, enable_prefix_caching=False)
    assert outputs_of(spec, prompts, GREEDY) == want
    assert spec.engine.runner.spec_stats.proposed > 0
    assert recorded.proposer.tracked_sequences == 0
    fresh, fresh_recorded = mtp_llm(name, enable_prefix_caching=False)
    for tokens in [t for t, draft in recorded.drafts.items() if draft][-12::4]:
        # the fresh engine prefills tokens[:-1], samples tokens[-1] (greedy, deterministic), drafts
        fresh.generate(list(tokens[:-1]), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        draft = recorded.drafts[tokens]  # cut short near max_tokens
        assert fresh_recorded.drafts[tokens][: len(draft)] == draft


def test_mtp_under_preemption_and_refused_without_mtp_layers() -> None:
    plain = LLM(TINY / "qwen3_next", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=6, max_tail_length=30)
    per_seq = 1 + MTP["num_speculative_tokens"]  # a sequence's slot and its draft positions' checkpoints
    state = 4 * per_seq * plain.loaded.model.state_bytes_per_slot() / 2**30
    budget = 1.5 * tight_kv_gib(plain) + state  # ~200 tokens of the model's KV and its MTP layer's
    spec, _ = mtp_llm(
        "qwen3_next",
        block_size=4,
        max_seq_len=128,
        max_num_seqs=4,
        enable_prefix_caching=False,
        kv_cache_memory_gib=budget,
    )
    assert outputs_of(spec, prompts, GREEDY) == outputs_of(plain, prompts, GREEDY)
    assert spec.engine.scheduler.num_preemptions > 0
    assert_no_leaks(spec)
    with pytest.raises(ConfigError, match="has none; use method 'ngram' or 'draft_model'"):
        LLM(TINY / "qwen3", speculative_config=MTP)
