"""Logit parity of a model family with the reference outputs of its tiny checkpoints.

Every prompt position's full log-softmax row must match the reference within `TOLERANCE` (fp32),
the greedy continuation of all prompts, run as one batch, must be the reference's token for token,
and each decode step's log-probability of its token (KV cache in use) must match too. A family
plugin runs these checks on all its checkpoints with a three-line test class::

    from atlas_core.testing.parity import ReferenceParity

    class TestReferenceParity(ReferenceParity):
        checkpoints = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.model.vision import PreparedImage
from atlas_core.testing.checkpoints import REFERENCE_PROMPTS, TinyCheckpoints

TOLERANCE = 1e-3
"""Largest |log-prob difference| to the reference allowed anywhere (fp32)."""


def full_prompt_logprobs(llm: LLM, prompt: list[int], images: Sequence[PreparedImage] = ()) -> np.ndarray:
    """``[T, V]`` log-softmax of every prompt position, from one prefill through the engine's runner
    (``images``: prepared images for the prompt's placeholders, in order)."""
    engine = llm.engine
    # prompt_logprobs: no prefix-cache reuse and no chunk cut at a state-snapshot boundary, so one step runs it all
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    engine.add_request("score", None, prompt, params, images)
    try:
        step = engine.scheduler.schedule()
        batch, _ = engine.runner.build_batch(step.chunks)
        model, backend = engine.runner.model, engine.backend
        hidden = model.forward(batch, engine.kv)
        return backend.to_numpy(backend.log_softmax(model.compute_logits(hidden)))
    finally:
        engine.abort("score")


def max_prompt_logprob_error(llm: LLM, reference: dict[str, np.ndarray]) -> float:
    """Largest |log-prob difference| between ``llm`` and ``reference`` over every position of every
    prompt: what the parity check bounds by `TOLERANCE` (tests that alter a model use it to show that
    the check would notice)."""
    return max(
        float(np.abs(full_prompt_logprobs(llm, reference[f"prompt_{i}"].tolist()) - reference[f"logprobs_{i}"]).max())
        for i in range(REFERENCE_PROMPTS)
    )


def assert_prompt_logprobs_match(llm: LLM, reference: dict[str, np.ndarray], what: str) -> None:
    """Every prompt position's log-softmax row is the reference's within `TOLERANCE`."""
    for i in range(REFERENCE_PROMPTS):
        ours = full_prompt_logprobs(llm, reference[f"prompt_{i}"].tolist())
        want = reference[f"logprobs_{i}"]
        np.testing.assert_allclose(ours, want, atol=TOLERANCE, rtol=0, err_msg=f"{what} prompt {i}")


def assert_greedy_decode_matches(llm: LLM, reference: dict[str, np.ndarray], what: str) -> None:
    """All reference prompts decoded greedily in one batch give the reference tokens, each with its
    reference log-probability within `TOLERANCE`."""
    prompts = [reference[f"prompt_{i}"].tolist() for i in range(REFERENCE_PROMPTS)]
    new_tokens = len(reference["greedy_0"])
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=0)
    for i, output in enumerate(llm.generate(prompts, params)):
        completion = output.outputs[0]
        assert completion.token_ids == reference[f"greedy_{i}"].tolist(), f"{what} prompt {i}"
        assert completion.logprobs is not None
        expected = reference[f"greedy_logprobs_{i}"]
        got = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
        want = [expected[j, token] for j, token in enumerate(completion.token_ids)]
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0, err_msg=f"{what} prompt {i}")


class ReferenceParity:
    """Base of a test class that checks every checkpoint of ``checkpoints`` against its reference.

    Subclasses set ``checkpoints`` (and ``backend``, the registered backend name to run on; default
    ``numpy``); each test runs once per checkpoint, with the checkpoint's name as the test id. Models
    come from `TinyCheckpoints.shared_llm`."""

    checkpoints: ClassVar[TinyCheckpoints]
    backend: ClassVar[str] = "numpy"

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "checkpoint" in metafunc.fixturenames:
            metafunc.parametrize("checkpoint", self.checkpoints.names)

    def test_prompt_logprobs_match_reference(self, checkpoint: str) -> None:
        llm = self.checkpoints.shared_llm(checkpoint, self.backend)
        assert_prompt_logprobs_match(llm, self.checkpoints.reference(checkpoint), checkpoint)

    def test_greedy_decode_matches_reference(self, checkpoint: str) -> None:
        llm = self.checkpoints.shared_llm(checkpoint, self.backend)
        assert_greedy_decode_matches(llm, self.checkpoints.reference(checkpoint), checkpoint)
