"""Request lifecycle: n > 1, aborts, errors, seeds, sampler parameters, and no leaked blocks."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.batch.kv_cache import KVCacheTooSmallError
from tests.conftest import TINY, reference


@pytest.fixture
def llm() -> LLM:
    return LLM(TINY / "llama", block_size=4)


def assert_no_leaks(llm: LLM) -> None:
    engine = llm.engine
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.requests
    engine.blocks.check_invariants()


def test_n_completions_share_the_prompt_and_differ(llm: LLM) -> None:
    prompt = reference("llama")["prompt_3"].tolist()
    output = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=3, ignore_eos=True))[0]
    assert [c.index for c in output.outputs] == [0, 1, 2, 3]
    sequences = {tuple(c.token_ids) for c in output.outputs}
    assert len(sequences) > 1 and all(len(c.token_ids) == 16 for c in output.outputs)
    again = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=3, ignore_eos=True))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in output.outputs]
    assert_no_leaks(llm)


def test_n_greedy_completions_equal_the_reference(llm: LLM) -> None:
    ref = reference("llama")
    output = llm.generate(ref["prompt_2"].tolist(), SamplingParams(n=3, temperature=0, max_tokens=10, ignore_eos=True))[
        0
    ]
    assert all(c.token_ids == ref["greedy_2"].tolist() for c in output.outputs)


def test_seed_gives_the_same_tokens_alone_or_batched(llm: LLM) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=12, seed=11, ignore_eos=True)
    prompt = reference("llama")["prompt_1"].tolist()
    alone = llm.generate(prompt, params)[0].outputs[0].token_ids
    others = [[int(t) for t in np.arange(i, i + 9) % 256] for i in range(6)]
    batched = llm.generate(others + [prompt], [SamplingParams(temperature=1.0, max_tokens=20)] * 6 + [params])
    assert batched[-1].outputs[0].token_ids == alone


def test_abort_mid_prefill_and_mid_decode_frees_everything() -> None:
    llm = LLM(TINY / "llama", block_size=4, max_num_batched_tokens=16)  # the long prompt takes many steps
    engine = llm.engine
    long_prompt = list(range(200))
    engine.add_request("decoding", None, [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("prefilling", None, long_prompt, SamplingParams(max_tokens=5))
    for _ in range(3):
        engine.step()
    prefilling = engine.requests["prefilling"].seqs[0]
    decoding = engine.requests["decoding"].seqs[0]
    assert 0 < prefilling.num_computed < len(long_prompt) and decoding.is_decoding
    engine.abort("prefilling")
    engine.abort("decoding")
    assert prefilling.finish_reason == "abort" and decoding.finish_reason == "abort"
    assert_no_leaks(llm)


def test_an_exception_fails_only_its_request(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas_core.engine.sequence import Sequence

    original = Sequence.append_token

    def flaky(self: Sequence, token: int) -> None:
        if self.request.request_id == "bad":
            raise RuntimeError("detokenizer exploded")
        original(self, token)

    monkeypatch.setattr(Sequence, "append_token", flaky)
    engine = llm.engine
    engine.add_request("bad", None, [5, 6, 7], SamplingParams(max_tokens=4))
    engine.add_request("good", None, [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    assert finished["bad"].outputs[0].finish_reason == "error" and "detokenizer exploded" in finished["bad"].error
    assert len(finished["good"].outputs[0].token_ids) == 4
    assert_no_leaks(llm)


def test_a_failing_forward_fails_its_batch_and_the_engine_recovers(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = llm.engine
    calls = {"n": 0}
    original = engine.runner.model.forward

    def failing_once(batch, kv):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("out of memory")
        return original(batch, kv)

    monkeypatch.setattr(engine.runner.model, "forward", failing_once)
    engine.add_request("victim", None, [1, 2, 3], SamplingParams(max_tokens=3))
    outputs = engine.step()
    assert outputs[0].finished and outputs[0].outputs[0].finish_reason == "error"
    assert_no_leaks(llm)
    assert len(llm.generate([4, 5, 6], SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0].token_ids) == 3


def test_min_tokens_suppresses_stop_tokens_until_reached(llm: LLM) -> None:
    stop = 2
    params = SamplingParams(temperature=0, max_tokens=8, min_tokens=5, logit_bias={stop: 100.0}, stop_token_ids=[stop])
    output = llm.generate([1, 2, 3], params)[0].outputs[0]
    assert stop not in output.token_ids[:5] and output.token_ids[5] == stop
    assert output.finish_reason == "stop" and output.stop_reason == stop and len(output.token_ids) == 6


def test_logit_bias_and_stop_token_ids(llm: LLM) -> None:
    output = llm.generate([9, 9, 9], SamplingParams(temperature=0, max_tokens=5, logit_bias={77: 100.0}))[0].outputs[0]
    assert output.token_ids == [77] * 5
    stopped = llm.generate(
        [9, 9, 9], SamplingParams(temperature=0, max_tokens=5, logit_bias={77: 100.0}, stop_token_ids=[77])
    )[0]
    assert stopped.outputs[0].token_ids == [77] and stopped.outputs[0].stop_reason == 77


def test_repetition_penalty_changes_a_repetitive_greedy_run(llm: LLM) -> None:
    plain = (
        llm.generate([3, 3, 3, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
        .outputs[0]
        .token_ids
    )
    penalised = (
        llm.generate(
            [3, 3, 3, 3],
            SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0),
        )[0]
        .outputs[0]
        .token_ids
    )
    assert len(set(penalised)) > len(set(plain))


def test_a_kv_cache_short_of_max_num_seqs_names_the_budget_for_all_of_them(caplog: pytest.LogCaptureFixture) -> None:
    """Fewer full-length sequences fit than max_num_seqs: the log line proposes the budget that holds them all,
    and that budget does."""
    with caplog.at_level(logging.INFO, logger="atlas.engine"):
        LLM(TINY / "llama", kv_cache_memory_gib=0.001, max_seq_len=512, max_num_seqs=8).close()
    proposed = re.search(r"or kv_cache_memory_gib=([\d.]+) for all of them\.", caplog.text)
    assert proposed is not None, caplog.text
    with LLM(TINY / "llama", kv_cache_memory_gib=float(proposed.group(1)), max_seq_len=512, max_num_seqs=8) as llm:
        assert llm.engine.kv_capacity_tokens // 512 >= 8


def test_kv_sizing_error_states_numbers_and_fitting_settings() -> None:
    with pytest.raises(KVCacheTooSmallError) as excinfo:
        LLM(TINY / "llama", kv_cache_memory_gib=1e-5, max_seq_len=512)
    message = str(excinfo.value)
    assert "kv_cache_memory_gib=1e-05" in message and "bytes per token" in message
    assert "needs 32 blocks" in message and message.endswith("Set kv_cache_memory_gib=0.01.")
    with pytest.raises(KVCacheTooSmallError, match=r"Lower max_seq_len to at most 48, or set kv_cache_memory_gib=0.01"):
        LLM(TINY / "llama", kv_cache_memory_gib=4e-5, max_seq_len=512)
