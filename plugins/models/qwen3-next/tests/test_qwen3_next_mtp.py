"""The ``mtp.*`` multi-token-prediction layers of Qwen3-Next and Qwen3.5-MoE tiny checkpoints: the MTP
head's logits over every prompt position match ``mtp_reference.npz``, which transformers' own modules
computed for the published architecture (``scripts/make_mtp_fixtures.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.engine.spec.mtp import MtpProposer
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import TOLERANCE

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_mtp_head_logits_match_the_reference(name: str) -> None:
    """After each prefill chunk the MTP layer runs over its positions ``p`` (the target's hidden state
    there and token ``p + 1``): its log-probabilities for tokens ``p + 2``."""
    llm = LLM(TINY / name, speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    speculation = llm.engine.speculation
    assert speculation is not None and isinstance(speculation.proposer, MtpProposer)
    head = speculation.proposer.head
    backend = llm.engine.backend
    rows: list[np.ndarray] = []
    forward = head.forward

    def recording(step: int, *args: Any) -> Any:
        out = forward(step, *args)
        if step == 0:
            rows.append(backend.to_numpy(backend.log_softmax(head.logits(out))).astype(np.float32))
        return out

    head.forward = recording  # type: ignore[method-assign]
    reference = np.load(TINY / name / "mtp_reference.npz")
    prompts = np.load(TINY / name / "reference.npz")
    for i in range(4):
        if f"mtp_logprobs_{i}" not in reference:
            continue
        rows.clear()
        llm.generate(prompts[f"prompt_{i}"].tolist(), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        want = reference[f"mtp_logprobs_{i}"]
        got = np.concatenate(rows)[: len(want)]  # chunked prefill: one MTP pass per chunk, in order
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0, err_msg=f"{name} prompt {i}")
