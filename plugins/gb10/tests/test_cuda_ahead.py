"""Decode steps queued ahead on the cuda backend (`atlas_core.engine.ahead`): the asynchronous copy of sampled
tokens, and whole models giving the tokens of steps run in turn while the next step is launched before the tokens
are read. Needs a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core import LLM, SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))
REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")


def test_download_waits_for_its_copy_and_not_for_later_work() -> None:
    backend = CudaBackend()
    cp = backend.cp
    tokens = cp.arange(7, dtype=np.int32) * 3
    download = backend.download_async(tokens)
    tokens[:] = -1  # queued after the copy: the copy holds the values from before
    big = cp.ones((4096, 4096), dtype=np.float32)
    for _ in range(20):  # work queued after the copy, still running when it is read
        big = big @ big / 4096.0
    np.testing.assert_array_equal(download.result(), np.arange(7, dtype=np.int32) * 3)
    assert download.result().dtype == np.int32
    cp.cuda.Device().synchronize()


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "deepseek_v3", "qwen3_next", "nemotron_h"])
def test_steps_queued_ahead_give_the_tokens_of_steps_run_in_turn(name: str) -> None:
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [11] * 20]
    params = [
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.8, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=33, temperature=0.7, top_p=0.9, seed=5, ignore_eos=True),
    ]
    llm = LLM(TINY / name, backend="cuda", max_seq_len=256, enable_prefix_caching=False, kv_cache_memory_gib=0.25)
    runner = llm.engine.runner
    queue, runner.ahead = runner.ahead, None
    want = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    runner.ahead = queue
    got = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    assert got == want
    assert queue is not None and queue.hits >= 25
