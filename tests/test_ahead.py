"""Decode steps queued ahead of reading the tokens before them (`atlas_core.engine.ahead`): on a backend that
queues work, the engine's outputs are those of steps run one after the other, whether the queued step is taken
for the sequences left (one finished or was aborted meanwhile) or beside a request that joined, models with
recurrent state included.

The numpy backend computes as it is called; here it claims to queue work, which runs every path of the queue
(its steps then simply run before the tokens are read)."""

from __future__ import annotations

from typing import Any

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.testing.family import assert_batch_invariant, greedy_alone, step_requests
from tests.conftest import TINY

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11] * 20]
PARAMS = [
    SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),  # crosses KV blocks
    SamplingParams(max_tokens=25, temperature=0.8, seed=3, ignore_eos=True),  # finishes first
    SamplingParams(max_tokens=33, temperature=0.7, top_p=0.9, seed=5, ignore_eos=True),
]


def run(
    queues: bool, monkeypatch: Any, steps: Any = None, params: list[SamplingParams] = PARAMS, model: str = "llama"
) -> tuple[list[list[int]], int]:
    """Every request's tokens (a fresh engine on a numpy backend that does, or does not, claim to queue work) and
    the steps taken from the queue. ``steps(engine, step)`` runs before each engine step."""
    monkeypatch.setattr(NumpyBackend, "queues_work", queues)
    engine = LLM(TINY / model, backend="numpy", max_seq_len=256).engine
    requests = list(zip(PROMPTS, params, strict=True))
    first, min_steps = (None, 0) if steps is None else (2, 8)
    outputs = step_requests(engine, requests, first=first, on_step=steps, min_steps=min_steps)
    tokens = [outputs[request_id].outputs[0].token_ids for request_id in sorted(outputs)]
    return tokens, engine.runner.ahead.hits if engine.runner.ahead is not None else 0


def test_steps_queued_ahead_give_the_tokens_of_steps_run_in_turn(monkeypatch: Any) -> None:
    queued, hits = run(True, monkeypatch)
    in_turn, none = run(False, monkeypatch)
    assert queued == in_turn
    assert none == 0
    assert [len(tokens) for tokens in queued] == [40, 25, 33]
    # every decode step after the first (tokens 3 to 40 of the longest request) is queued: those whose token starts
    # a KV block (16 tokens a block) reserve it, and a sequence that finishes with its last token leaves its row
    assert hits == 38


def test_a_finished_or_aborted_sequence_leaves_the_rest_of_the_queued_step(monkeypatch: Any) -> None:
    stop_at = run(False, monkeypatch)[0][0][12]  # a token the first request samples, as its stop token
    params = [SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[stop_at]), *PARAMS[1:]]

    def abort(engine: Any, step: int) -> None:
        if step == 20:
            engine.abort("1")

    queued, hits = run(True, monkeypatch, abort, params)
    in_turn, _ = run(False, monkeypatch, abort, params)
    assert queued == in_turn
    assert queued[0][-1] == stop_at and len(queued[0]) <= 13
    assert hits > 0


def test_a_request_that_joins_runs_beside_the_queued_step_and_changes_nothing(monkeypatch: Any) -> None:
    def join(engine: Any, step: int) -> None:
        if step == 6:
            engine.add_request("2", None, PROMPTS[2], PARAMS[2])

    queued, hits = run(True, monkeypatch, join)
    in_turn, _ = run(False, monkeypatch, join)
    assert queued == in_turn
    assert hits > 0


def test_recurrent_models_queue_no_step_whose_token_starts_a_block(monkeypatch: Any) -> None:
    """Their states are saved for the prefix cache at block boundaries, after the step that reaches one."""
    queued, hits = run(True, monkeypatch, model="qwen3_next")
    assert queued == run(False, monkeypatch, model="qwen3_next")[0]
    assert 0 < hits < 38


def test_steps_that_depend_on_the_unread_token_are_not_queued(monkeypatch: Any) -> None:
    """Penalties, logprobs and pending min_tokens depend on the token the queued step would run ahead of."""
    params = [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=20, temperature=0.0, min_tokens=19),
    ]
    for sampling in params:
        queued, hits = run(True, monkeypatch, params=[sampling] * 3)
        assert queued == run(False, monkeypatch, params=[sampling] * 3)[0]
        assert hits == 0


@pytest.mark.parametrize("model", ["qwen3_next", "qwen3_5"])
def test_models_with_recurrent_state_take_every_queued_step(monkeypatch: Any, model: str) -> None:
    """A queued step advances recurrent state in place: it is taken, never dropped, when a sequence finishes or
    a request joins meanwhile (the joining chunk runs in a forward of its own)."""

    def join(engine: Any, step: int) -> None:
        if step == 6:
            engine.add_request("2", None, PROMPTS[2], PARAMS[2])

    for steps in (None, join):
        queued, hits = run(True, monkeypatch, steps, model=model)
        assert queued == run(False, monkeypatch, steps, model=model)[0]
        assert hits > 0


def test_closing_the_engine_lets_the_queued_step_finish(monkeypatch: Any) -> None:
    monkeypatch.setattr(NumpyBackend, "queues_work", True)
    engine = LLM(TINY / "llama", backend="numpy", max_seq_len=256).engine
    engine.add_request("0", None, PROMPTS[0], PARAMS[0])
    for _ in range(4):
        engine.step()
    assert engine.runner.ahead is not None and engine.runner.ahead.step is not None
    engine.close()
    assert engine.runner.ahead.step is None


@pytest.mark.parametrize("model", ["llama", "qwen3_next"])
@pytest.mark.parametrize(
    "settings",
    [{"enable_prefix_caching": True, "block_size": 4}, {"enable_prefix_caching": False, "kv_tokens": 160}],
    ids=["prefix-cache-small-blocks", "kv-pressure"],
)
def test_batches_with_steps_queued_ahead_give_each_prompt_its_tokens_alone(
    monkeypatch: Any, model: str, settings: dict[str, Any]
) -> None:
    """Mixed prompts batched together, with prefix-cache hits (and, for hybrids, state snapshots at block
    boundaries) or with preemption under KV pressure, give the tokens each prompt gives alone."""
    monkeypatch.setattr(NumpyBackend, "queues_work", False)
    alone = greedy_alone(TINY / model, count=9)
    settings = dict(settings)
    tokens = settings.pop("kv_tokens", None)
    if tokens is not None:
        probe = LLM(TINY / model, block_size=4, max_seq_len=128)
        slots = probe.loaded.model.state_bytes_per_slot() if probe.loaded.model.has_recurrent_state else 0
        state_bytes = 2 * probe.engine.config.max_num_seqs * slots
        settings |= {"block_size": 4, "max_seq_len": 128}
        settings["kv_cache_memory_gib"] = (tokens * probe.engine.kv_plan.bytes_per_token + state_bytes) / 2**30
    monkeypatch.setattr(NumpyBackend, "queues_work", True)
    assert_batch_invariant(TINY / model, alone, settings)


def test_a_failed_replica_drops_the_queued_step_without_reading_it() -> None:
    """`AheadQueue.drop` on a split replica that failed: ``settle`` raises the failure, and the step's tokens are
    not read (its work may never finish); otherwise they are read once ``settle`` returned."""
    from atlas_core.comm import CommError
    from atlas_core.engine.ahead import AheadQueue, AheadStep

    events: list[str] = []

    class Download:
        def result(self) -> Any:
            events.append("read")

    def settle(fails: bool) -> None:
        events.append("settle")
        if fails:
            raise CommError("rank 1 is gone")

    for fails, expected in ((True, ["settle"]), (False, ["settle", "read"])):
        events.clear()
        queue = AheadQueue(None, None, None, None, lambda fails=fails: settle(fails))  # type: ignore[arg-type]
        queue.step = AheadStep(None, None, Download())  # type: ignore[arg-type]
        queue.drop()
        assert events == expected and queue.step is None
