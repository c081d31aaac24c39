"""`AsyncEngine`: concurrent consumers, cancellation frees everything, errors reach their consumer."""

from __future__ import annotations

import asyncio

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.engine.async_engine import AsyncEngine
from atlas_core.errors import InvalidRequestError
from tests.conftest import TINY, reference


async def collect(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> list[int]:
    final = None
    async for output in engine.generate(None, prompt, params):
        final = output
    return final.outputs[0].token_ids


def test_concurrent_streams_match_offline_results_and_cancellation_frees_blocks() -> None:
    llm = LLM(TINY / "llama", block_size=4)
    ref = reference("llama")
    prompts = [ref[f"prompt_{i}"].tolist() for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = AsyncEngine(llm.engine)

    async def scenario() -> list[list[int]]:
        endless = asyncio.create_task(collect(engine, [1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True)))
        results = await asyncio.gather(*(collect(engine, p, greedy) for p in prompts))
        endless.cancel()
        with pytest.raises(asyncio.CancelledError):
            await endless
        return results

    try:
        results = asyncio.run(scenario())
    finally:
        engine.shutdown()  # runs the queued abort of the cancelled request first
    for i, tokens in enumerate(results):
        assert tokens == ref[f"greedy_{i}"].tolist()
    assert not llm.engine.requests
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks


def test_invalid_request_raises_before_streaming() -> None:
    llm = LLM(TINY / "llama")
    engine = AsyncEngine(llm.engine)

    async def scenario() -> None:
        with pytest.raises(InvalidRequestError, match="prompt is empty"):
            await collect(engine, [], SamplingParams())

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
