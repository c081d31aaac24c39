"""The next decode step prepared while the current one runs (`atlas_core.engine.lookahead`): the steps that run
a prepared batch give the tokens and log-probabilities of batches built afresh, and a step whose chunks are not
the predicted ones (a request joined, one finished, a new KV block) is built afresh."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core import LLM, SamplingParams
from atlas_core.testing.family import step_requests
from tests.conftest import TINY

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11] * 20]
PARAMS = [
    SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),  # crosses KV blocks
    SamplingParams(max_tokens=25, temperature=0.8, seed=3, ignore_eos=True),  # finishes first
    SamplingParams(max_tokens=33, temperature=0.0, ignore_eos=True, logprobs=2, repetition_penalty=1.3),
]


def run(lookahead: bool, steps: Any = None, count: int = len(PROMPTS)) -> tuple[list[Any], int]:
    """The first ``count`` requests' tokens and log-probabilities (a fresh engine), and the steps that ran a
    prepared batch. ``steps(engine, step)``: called before each engine step (to add requests on the way)."""
    llm = LLM(TINY / "llama", backend="numpy", max_seq_len=256)
    engine = llm.engine
    if not lookahead:
        engine.runner.lookahead = None
    requests = list(zip(PROMPTS[:count], PARAMS[:count], strict=True))
    first, min_steps = (None, 0) if steps is None else (2, 6)
    outputs = step_requests(engine, requests, first=first, on_step=steps, min_steps=min_steps)
    results = []
    for request_id in sorted(outputs):
        completion = outputs[request_id].outputs[0]
        logprobs = [sorted((t, e.logprob) for t, e in entry.items()) for entry in completion.logprobs or []]
        results.append((completion.token_ids, logprobs))
    hits = engine.runner.lookahead.hits if engine.runner.lookahead is not None else 0
    return results, hits


def same(a: list[Any], b: list[Any]) -> None:
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(a, b, strict=True):
        assert tokens_a == tokens_b
        for entry_a, entry_b in zip(logprobs_a, logprobs_b, strict=True):
            assert [t for t, _ in entry_a] == [t for t, _ in entry_b]
            np.testing.assert_array_equal([p for _, p in entry_a], [p for _, p in entry_b])


def test_prepared_steps_give_the_outputs_of_batches_built_afresh() -> None:
    prepared, hits = run(lookahead=True)
    afresh, none = run(lookahead=False)
    same(prepared, afresh)
    assert none == 0
    # 40 steps: the prefill, the first decode step (nothing prepared yet), the two after a request finished
    # (another set of sequences), and 36 prepared, KV block boundaries included
    assert hits == 36


def test_a_lone_sequence_decodes_from_prepared_steps_across_kv_blocks() -> None:
    prepared, hits = run(lookahead=True, count=1)
    afresh, _ = run(lookahead=False, count=1)
    same(prepared, afresh)
    assert hits == 38  # 40 tokens: the first from the prefill, the second from a step built afresh


def test_a_request_that_joins_is_built_afresh_and_changes_nothing() -> None:
    def join(engine: Any, step: int) -> None:
        if step == 5:
            engine.add_request("2", None, PROMPTS[2], PARAMS[2])

    prepared, hits = run(lookahead=True, steps=join)
    afresh, _ = run(lookahead=False, steps=join)
    same(prepared, afresh)
    assert hits > 0


def test_a_backend_can_keep_its_steps_from_being_prepared(monkeypatch: Any) -> None:
    from atlas_core.backends.numpy_backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "prepares_decode_steps", False)
    llm = LLM(TINY / "llama", backend="numpy", max_seq_len=256)
    assert llm.engine.runner.lookahead is None
    assert llm.generate([PROMPTS[0]], PARAMS[0])[0].outputs[0].token_ids == run(lookahead=False, count=1)[0][0][0]


def test_sampled_tokens_that_cannot_be_the_next_token_ids_drop_the_prepared_step() -> None:
    from atlas_core.backends.numpy_backend import NumpyBackend
    from atlas_core.engine.lookahead import DecodeLookahead, Prediction

    lookahead = DecodeLookahead(NumpyBackend(), block_size=16)
    device = [np.zeros(2, np.int32)] * 6
    for tokens in (np.zeros(2, np.int64), np.zeros(4, np.int32)[::2], [0, 0], np.zeros(3, np.int32)):
        lookahead._next = Prediction([object(), object()], [1, 1], [[0], [1]], [-1, -1], (), device)  # type: ignore[list-item]
        lookahead.sampled(tokens)
        assert lookahead._next is None
    lookahead._next = Prediction([object(), object()], [1, 1], [[0], [1]], [-1, -1], (), device)  # type: ignore[list-item]
    lookahead.sampled(np.zeros(2, np.int32))
    assert lookahead._next is not None and lookahead._next.tokens is not None
