"""Checks of a family's multi-token-prediction heads (`atlas_core.model.mtp`) on its tiny checkpoints.

A tiny checkpoint with MTP layers carries ``mtp_reference.npz`` (``scripts/make_mtp_fixtures.py``): for
each prompt ``i`` of ``reference.npz`` with two tokens or more, ``mtp_logprobs_i`` ``[T_i - 1, V]``, the
log-probabilities the head's first step gives at positions ``p = 0 .. T_i - 2`` (the target's hidden
state at ``p`` and token ``p + 1``) for token ``p + 2``; optionally, for the first chained step after
the prompt's prefill (its greedy token appended), the draft the first step makes, ``mtp_draft_i``, and
the chained step's log-probabilities, ``mtp_chain_logprobs_i`` ``[V]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atlas_core import LLM, SamplingParams
from atlas_core.engine.spec.mtp import MtpProposer
from atlas_core.model.mtp import MtpHead
from atlas_core.testing.parity import TOLERANCE

MTP_CONFIG = {"method": "mtp", "num_speculative_tokens": 1}
"""Speculative decoding with the checkpoint's MTP layers, one draft token a step."""


def mtp_head(llm: LLM) -> MtpHead:
    """The MTP head of an engine made with ``speculative_config`` method ``mtp``."""
    speculation = llm.engine.speculation
    assert speculation is not None and isinstance(speculation.proposer, MtpProposer)
    return speculation.proposer.head


def assert_mtp_head_matches_reference(folder: Path, **engine_args: Any) -> None:
    """Each reference prompt of the checkpoint ``folder``, prefilled by an engine speculating two tokens a
    step with its MTP layers (``engine_args`` go to `LLM`): the head's first-step log-probabilities over the
    prompt's positions (one MTP pass per prefill chunk, in order), and where the reference has them the
    first draft and the chained step's log-probabilities, equal ``mtp_reference.npz`` within `TOLERANCE`."""
    llm = LLM(folder, speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **engine_args)
    head, backend = mtp_head(llm), llm.engine.backend
    calls: list[np.ndarray] = []  # each MTP pass's log-probabilities, in order
    forward = head.forward

    def recording(layer: int, *args: Any) -> Any:
        out = forward(layer, *args)
        calls.append(backend.to_numpy(backend.log_softmax(head.logits(out, layer))).astype(np.float32))
        return out

    head.forward = recording  # type: ignore[method-assign, assignment]
    reference = np.load(folder / "mtp_reference.npz")
    prompts = np.load(folder / "reference.npz")
    assert any(key.startswith("mtp_logprobs_") for key in reference.files), f"{folder}: no MTP reference"
    i = 0
    while f"prompt_{i}" in prompts:
        prompt = prompts[f"prompt_{i}"].tolist()
        calls.clear()
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        # the prefill's passes (one per chunk) have a row per prompt position, then the chained step runs
        prefill = np.concatenate(calls)[: len(prompt)]
        if f"mtp_logprobs_{i}" in reference:
            want = reference[f"mtp_logprobs_{i}"]
            np.testing.assert_allclose(prefill[:-1], want, atol=TOLERANCE, rtol=0, err_msg=f"{folder.name} prompt {i}")
        if f"mtp_chain_logprobs_{i}" in reference:
            assert int(prefill[-1].argmax()) == int(reference[f"mtp_draft_{i}"][0]), f"{folder.name} prompt {i}"
            chained = calls[int(np.searchsorted(np.cumsum([len(c) for c in calls]), len(prompt))) + 1]
            np.testing.assert_allclose(
                chained[0], reference[f"mtp_chain_logprobs_{i}"], atol=TOLERANCE, rtol=0,
                err_msg=f"{folder.name} prompt {i}, chained step",
            )  # fmt: skip
        i += 1
