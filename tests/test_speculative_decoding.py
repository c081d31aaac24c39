"""Speculative decoding: proposals verified in the target's forward never change what users get.

Greedy and seeded outputs are identical with and without speculation (dense, MoE and hybrid tiny
checkpoints; alone and batched; with prefix caching and under preemption); the distribution of sampled
tokens is the target's; nothing is leaked after rejections and aborts.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.backends.ops.checkpoints import CHECKPOINTED_TOKENS
from atlas_core.batch.kv_cache import KVCacheTooSmallError
from atlas_core.engine.runner import ScheduledChunk
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.config import SpeculativeConfig, speculative_config
from atlas_core.engine.spec.draft_kv import DraftKV
from atlas_core.engine.spec.draft_model import DraftModelProposer
from atlas_core.engine.spec.proposer import NgramProposer
from atlas_core.errors import ConfigError
from atlas_core.testing.family import assert_no_leaks, mixed_prompts
from tests.conftest import TINY

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


class ScriptedProposer:
    """Proposes each sequence's known continuation (``script[prompt]``), with every ``wrong_every``-th
    draft token replaced by a wrong one, so verification both accepts and rejects."""

    def __init__(self, script: dict[tuple[int, ...], list[int]], vocab: int, wrong_every: int = 3) -> None:
        self.script, self.vocab, self.wrong_every = script, vocab, wrong_every
        self.calls = 0
        self.released: list[Sequence] = []

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        drafts = []
        for seq, k in zip(seqs, max_tokens, strict=True):
            self.calls += 1
            future = self.script[tuple(seq.token_ids[: seq.num_prompt_tokens])][len(seq.output_ids) :][:k]
            if self.calls % self.wrong_every == 0 and future:
                future = [*future[:-1], (future[-1] + 1) % self.vocab]
            drafts.append(future)
        return drafts

    def release(self, seq: Sequence) -> None:
        self.released.append(seq)


def outputs_of(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params)]


def test_config_from_flags_and_json() -> None:
    assert speculative_config(None, None) is None
    assert speculative_config(None, 3) == SpeculativeConfig("ngram", 3)
    assert speculative_config({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 6}, None) == (
        SpeculativeConfig("ngram", 5, prompt_lookup_max=6)
    )
    assert speculative_config({"model": "draft-folder"}, 2) == SpeculativeConfig("draft_model", 2, model="draft-folder")
    assert speculative_config({"method": "qwen3_next_mtp"}, 2) == SpeculativeConfig("mtp", 2)
    bad = [
        ({"method": "eagle3", "num_speculative_tokens": 2}, None, "method must be one of ngram, mtp, draft_model"),
        ({"method": "ngram", "num_tokens": 2}, None, "unknown keys ['num_tokens']"),
        ({"method": "ngram"}, None, 'needs "num_speculative_tokens"'),
        ({"method": "ngram", "num_speculative_tokens": 2}, 3, "disagrees"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, None, 'needs "model"'),
        (None, 0, "must be in 1..16"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, None, "must be an integer"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5}, None, "prompt_lookup_min <="),
    ]
    for spec, count, message in bad:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            speculative_config(spec, count)


def test_ngram_lookup_proposes_the_latest_continuation() -> None:
    lookup = NgramProposer(min_n=2, max_n=3).lookup
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3) == [7, 8, 1]  # the latest match wins
    assert lookup([5, 1, 2, 6, 1, 2], 4) == [6, 1, 2]  # at most what follows the match
    assert lookup([1, 2, 3, 4], 3) == []  # no earlier occurrence
    assert lookup([4, 4, 4, 4], 2) == [4]  # overlapping matches
    assert lookup([1, 2], 0) == []


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "qwen3_next", "nemotron_h"])
def test_greedy_tokens_identical_with_rejections_batched_and_cached(name: str) -> None:
    """Scripted drafts (right, then a wrong token every third proposal) over 8 prompts batched, with
    prefix caching: the tokens equal plain decoding's; on the hybrid model the recurrent state of
    sequences with rejected drafts is rolled back to the checkpoint of their last kept draft."""
    plain = LLM(TINY / name, enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=8)
    want = outputs_of(plain, prompts, GREEDY)
    spec = LLM(TINY / name, num_speculative_tokens=3, block_size=4)
    assert spec.engine.speculation is not None
    proposer = ScriptedProposer({tuple(p): w for p, w in zip(prompts, want, strict=True)}, spec.loaded.model.vocab_size)
    spec.engine.speculation.proposer = proposer
    execute, verified = spec.engine.runner.execute, []

    def recording(chunks: list[ScheduledChunk], copies: list[tuple[int, int]], run_ahead: bool) -> list[Sequence]:
        verified.extend((chunk.num_tokens, len(chunk.draft)) for chunk in chunks if chunk.draft)
        return execute(chunks, copies, run_ahead)

    spec.engine.runner.execute = recording  # type: ignore[method-assign]
    for _ in range(2):  # the second run hits the prefix cache the first filled
        assert outputs_of(spec, prompts, GREEDY) == want
        assert_no_leaks(spec)
    stats = spec.engine.runner.spec_stats
    assert 0 < stats.accepted < stats.proposed
    assert len(proposer.released) == 2 * len(prompts)
    # no token is computed twice: after a rejection the sequence decodes on from its restored state
    assert verified and all(tokens == 1 for tokens, _ in verified)


def test_ngram_greedy_and_seeded_sampling_identical_under_preemption() -> None:
    """n-gram speculation on repetitive prompts, with a KV cache small enough to force preemption:
    greedy tokens, and seeded samples for temperature / top-p / top-k, equal plain decoding's."""
    plain = LLM(TINY / "llama", enable_prefix_caching=False)
    vocab = plain.loaded.model.vocab_size
    prompts = [p + p[-12:] + p[-12:] for p in mixed_prompts(vocab, count=6, max_tail_length=30)]
    sampled = SamplingParams(temperature=0.9, top_p=0.95, top_k=20, max_tokens=20, ignore_eos=True, seed=5)
    spec = LLM(
        TINY / "llama", num_speculative_tokens=4, block_size=4, max_seq_len=128, kv_cache_memory_gib=tight_kv_gib(plain)
    )
    for params in (GREEDY, sampled):
        assert outputs_of(spec, prompts, params) == outputs_of(plain, prompts, params)
        assert_no_leaks(spec)
    assert spec.engine.scheduler.num_preemptions > 0
    assert spec.engine.runner.spec_stats.accepted > 0


def test_penalised_sequences_speculate_and_sample_as_plain_decoding() -> None:
    """Repetition, presence and frequency penalties: each verified row is penalised as if the drafts before
    it were kept, so greedy and seeded outputs equal plain decoding's while drafts are both accepted and
    rejected."""
    plain = LLM(TINY / "qwen3", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=4)
    penalties = {"repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.3}
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **penalties)
    seeded = SamplingParams(temperature=0.8, top_k=20, max_tokens=16, ignore_eos=True, seed=3, **penalties)
    spec = LLM(TINY / "qwen3", num_speculative_tokens=3)
    assert spec.engine.speculation is not None
    for params in (greedy, seeded):
        want = outputs_of(plain, prompts, params)
        proposer = ScriptedProposer({tuple(p): w for p, w in zip(prompts, want, strict=True)}, 256)
        spec.engine.speculation.proposer = proposer
        assert outputs_of(spec, prompts, params) == want
    stats = spec.engine.runner.spec_stats
    assert 0 < stats.accepted < stats.proposed


def test_structured_output_speculates_with_masks_that_follow_the_drafts(default_llm: LLM) -> None:
    """A JSON-schema constraint on the real model: each verified row is masked by the grammar after the
    drafts before it (a draft token the grammar refuses ends the run), so greedy and seeded outputs equal
    plain decoding's while drafts are accepted and rejected."""
    from atlas_core.parsing.structured import StructuredOutput

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    structured = StructuredOutput.json(schema)
    llm = default_llm
    prompts = [llm.require_tokenizer().encode(f"Plan a trip {i}. Answer in JSON:") for i in range(2)]
    spec = LLM(llm.loaded.resolved.path, backend="numpy", num_speculative_tokens=3)
    assert spec.engine.speculation is not None
    for params in (
        SamplingParams(temperature=0, max_tokens=12, structured=structured),
        SamplingParams(temperature=0.9, max_tokens=12, seed=11, structured=structured),
    ):
        want = outputs_of(llm, prompts, params)
        spec.engine.speculation.proposer = ScriptedProposer(
            {tuple(p): w for p, w in zip(prompts, want, strict=True)}, spec.loaded.model.vocab_size, wrong_every=2
        )
        assert outputs_of(spec, prompts, params) == want
    stats = spec.engine.runner.spec_stats
    assert 0 < stats.accepted < stats.proposed


def test_hybrid_drafts_stay_in_short_sequences() -> None:
    """On a hybrid model a chunk with drafts stays under `CHECKPOINTED_TOKENS` tokens (the recurrent ops checkpoint
    the draft positions of such sequences only; the NumPy references refuse others): a sequence resuming 70 known
    tokens (after preemption) gets no drafts, one decoding gets them."""
    spec = LLM(TINY / "qwen3_next", num_speculative_tokens=4, enable_prefix_caching=False)
    prompt = mixed_prompts(spec.loaded.model.vocab_size, count=1)[0]
    spec.engine.add_request("r", None, prompt, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    while not spec.engine.scheduler.running or not spec.engine.scheduler.running[0].output_ids:
        spec.engine.step()
    seq, scheduler = spec.engine.scheduler.running[0], spec.engine.scheduler
    assert scheduler._draft_room(seq, 100, {}, count=1) == 4
    assert scheduler._draft_room(seq, 100, {}, count=CHECKPOINTED_TOKENS - 3) == 2
    assert scheduler._draft_room(seq, 100, {}, count=70) == 0


def tight_kv_gib(llm: LLM) -> float:
    """A KV budget of about 200 tokens of ``llm``'s model."""
    per_token = llm.engine.kv_plan.bytes_per_token
    return 200 * per_token / 2**30


def test_logprobs_and_stops_inside_accepted_drafts() -> None:
    """A stop token or max_tokens reached inside a run of accepted drafts ends the sequence there; each
    output token carries the logprobs plain decoding gives it."""
    plain = LLM(TINY / "qwen3", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=4)
    full = outputs_of(plain, prompts, GREEDY)
    stop = full[0][6]
    params = SamplingParams(temperature=0, max_tokens=11, stop_token_ids=[stop], logprobs=2)
    want = plain.generate(prompts, params)
    spec = LLM(TINY / "qwen3", num_speculative_tokens=4)
    assert spec.engine.speculation is not None
    spec.engine.speculation.proposer = ScriptedProposer(
        {tuple(p): w for p, w in zip(prompts, full, strict=True)}, plain.loaded.model.vocab_size, wrong_every=5
    )
    got = spec.generate(prompts, params)
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
        assert g.outputs[0].logprobs is not None and w.outputs[0].logprobs is not None
        for got_entry, want_entry in zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True):
            assert got_entry.keys() == want_entry.keys()
            for token, entry in got_entry.items():
                assert entry.logprob == pytest.approx(want_entry[token].logprob, abs=1e-5)
    assert_no_leaks(spec)


def test_draft_model_proposals_and_abort_free_everything() -> None:
    """A draft model (here the target itself: every draft accepted) gives the plain tokens; aborting a
    request mid-generation frees its target and draft blocks."""
    plain = LLM(TINY / "qwen3", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=5)
    want = outputs_of(plain, prompts, GREEDY)
    config = {"method": "draft_model", "model": str(TINY / "qwen3"), "num_speculative_tokens": 3}
    spec = LLM(TINY / "qwen3", speculative_config=config)
    assert outputs_of(spec, prompts, GREEDY) == want
    stats = spec.engine.runner.spec_stats
    assert stats.accepted == stats.proposed > 0
    engine = spec.engine
    engine.add_request("r", None, prompts[0], GREEDY)
    for _ in range(3):
        engine.step()
    engine.abort("r")
    assert_no_leaks(spec)
    assert engine.speculation is not None and isinstance(engine.speculation.proposer, DraftModelProposer)
    _assert_cache_free(engine.speculation.proposer.cache)


def test_draft_model_reads_target_tokens_beyond_its_vocabulary_as_valid_ids() -> None:
    """A draft whose vocabulary is smaller than the target's (as a text-only draft of a vision-language target
    with image placeholders past it) is fed a valid id instead; the output is still the target's."""
    plain = LLM(TINY / "qwen3", enable_prefix_caching=False)
    prompt = [5, 250, 250, 7, 251, 9]  # ids past the draft vocabulary set below
    want = outputs_of(plain, [prompt], GREEDY)
    config = {"method": "draft_model", "model": str(TINY / "qwen3"), "num_speculative_tokens": 3}
    spec = LLM(TINY / "qwen3", speculative_config=config)
    proposer = spec.engine.speculation.proposer if spec.engine.speculation is not None else None
    assert isinstance(proposer, DraftModelProposer)
    proposer.draft.model.vocab_size = 240
    fed: list[int] = []
    batch = proposer.cache.batch

    def recording(rows: Any) -> Any:
        fed.extend(token for row in rows for token in row.token_ids)
        return batch(rows)

    proposer.cache.batch = recording  # type: ignore[method-assign]
    assert outputs_of(spec, [prompt], GREEDY) == want
    assert fed and max(fed) < 240 and 0 in fed


def _assert_cache_free(cache: DraftKV) -> None:
    assert cache.blocks is not None and cache.blocks.num_free_blocks == cache.blocks.num_blocks
    assert not cache.tables


def test_draft_model_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    words = ["The", "quick", "brown", "fox"]
    target = TINY.with_word_tokenizer(tmp_path / "target", "qwen3", words)
    same = TINY.with_word_tokenizer(tmp_path / "same", "qwen3", words)
    other = TINY.with_word_tokenizer(tmp_path / "other", "qwen3", words[::-1])
    LLM(target, speculative_config={"model": str(same), "num_speculative_tokens": 2})
    with pytest.raises(ConfigError, match="does not share the target's tokenizer"):
        LLM(target, speculative_config={"model": str(other), "num_speculative_tokens": 2})


def test_sampled_distribution_is_the_targets() -> None:
    """Chi-square over the joint distribution of the first three sampled tokens (top_k=2: 8 outcomes),
    2000 unseeded samples with a fixed draft that is accepted about half the time, against the exact
    probabilities from the model's own logprobs."""
    llm = LLM(TINY / "llama", enable_prefix_caching=False, max_num_seqs=256, num_speculative_tokens=1)
    prompt = mixed_prompts(llm.loaded.model.vocab_size, count=1)[0]
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=3, ignore_eos=True, logprobs=2)
    probe = llm.generate(prompt, params)[0].outputs[0]
    assert probe.logprobs is not None
    second = list(probe.logprobs[1])  # the two candidates of the second token (after the probe's first)

    class FixedDraft:
        def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
            return [[second[0]] for _ in seqs]

        def release(self, seq: Sequence) -> None:
            return None

    assert llm.engine.speculation is not None
    llm.engine.speculation.proposer = FixedDraft()
    samples = llm.generate([prompt] * 2000, params)
    counts: dict[tuple[int, ...], int] = {}
    for sample in samples:
        key = tuple(sample.outputs[0].token_ids)
        counts[key] = counts.get(key, 0) + 1
    expected = {key: _joint_probability(llm, prompt, list(key)) for key in counts}
    assert len(counts) <= 8 and sum(expected.values()) > 0.2
    statistic = sum((counts[key] - 2000 * p) ** 2 / (2000 * p) for key, p in expected.items())
    assert statistic < 26.1  # chi-square, 7 degrees of freedom: p = 0.0005
    assert 0 < llm.engine.runner.spec_stats.accepted < llm.engine.runner.spec_stats.proposed


def _joint_probability(llm: LLM, prompt: list[int], tokens: list[int]) -> float:
    """P(tokens | prompt) under temperature 1 and top_k=2, from the model's prompt logprobs."""
    scored = llm.generate(prompt + tokens, SamplingParams(max_tokens=1, prompt_logprobs=2))[0].prompt_logprobs
    assert scored is not None
    probability = 1.0
    for i, token in enumerate(tokens):
        entry = scored[len(prompt) + i]
        assert entry is not None
        top = sorted(entry.values(), key=lambda e: -e.logprob)[:2]
        top2 = {t for t, e in entry.items() if e in top}
        if token not in top2:
            return 0.0
        logps = np.array([e.logprob for e in top])
        probability *= float(np.exp(entry[token].logprob - np.logaddexp.reduce(logps)))
    return probability


def test_metrics_count_proposed_and_accepted_drafts() -> None:
    """``/metrics`` counters: drafts proposed and accepted, and accepted by draft position."""
    from prometheus_client import CollectorRegistry, generate_latest

    from atlas_core.server.metrics import _EngineCollector

    plain = LLM(TINY / "llama", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=3)
    want = outputs_of(plain, prompts, GREEDY)
    spec = LLM(TINY / "llama", num_speculative_tokens=3)
    assert spec.engine.speculation is not None
    spec.engine.speculation.proposer = ScriptedProposer({tuple(p): w for p, w in zip(prompts, want, strict=True)}, 256)
    assert outputs_of(spec, prompts, GREEDY) == want
    registry = CollectorRegistry()
    registry.register(_EngineCollector(spec.engine, lambda: "tiny"))
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("atlas_spec_decode")
    }
    stats = spec.engine.runner.spec_stats
    assert values['atlas_spec_decode_num_draft_tokens_total{model_name="tiny"}'] == stats.proposed > 0
    assert values['atlas_spec_decode_num_accepted_tokens_total{model_name="tiny"}'] == stats.accepted > 0
    per_position = [
        values[f'atlas_spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny",position="{i}"}}']
        for i in range(3)
    ]
    assert per_position == stats.accepted_at and sum(per_position) == stats.accepted
    assert (
        per_position[0] >= per_position[1] >= per_position[2]
    )  # a draft position is accepted only after the ones before


def test_a_draft_models_kv_share_too_small_asks_the_whole_budget_for_its_part() -> None:
    """The draft model's KV cache takes its share of the budget (here half: the draft is the target). When that
    share cannot hold one sequence, the setting proposed is the one that gives the whole budget what the share
    lacks over the share's part of it."""
    config = {"method": "draft_model", "model": str(TINY / "qwen3"), "num_speculative_tokens": 3}
    spec = LLM(TINY / "qwen3", speculative_config=config)
    speculation = spec.engine.speculation
    assert speculation is not None and isinstance(speculation.proposer, DraftModelProposer)
    per_token = speculation.proposer.cache.bytes_per_token
    asked: list[int] = []

    def more(extra: int) -> str:
        asked.append(extra)
        return f"kv_cache_memory_gib={extra}"

    one_sequence = spec.engine.max_seq_len * per_token
    with pytest.raises(
        KVCacheTooSmallError, match=rf"share of none gives 0.0 MiB.*Set kv_cache_memory_gib={2 * one_sequence}\.$"
    ):
        speculation.allocate_kv(0, per_token, spec.engine.config, "none", more)
    assert asked == [2 * one_sequence]
    spec.close()
