"""Speculative decoding on the cuda backend: verify steps (several rows per sequence, replayed from
their own graphs when every sequence has as many drafts) give the greedy tokens of plain decoding (one
row per sequence), for scripted drafts on dense, MoE and hybrid models and for the MTP layers of the hybrid
checkpoints, whose drafts after captured steps equal those of an engine without graphs. Needs a CUDA
GPU."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core import LLM, SamplingParams
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.mtp import MtpProposer
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import assert_no_leaks, mixed_prompts

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))
REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
MTP = {"method": "mtp", "num_speculative_tokens": 2}


def on_gpu(**settings: Any) -> dict[str, Any]:
    """`LLM` settings for the cuda backend taking 1 GiB more than what is in use (engines side by side), in the
    batch-invariant mode (speculative and plain runs batch their tokens differently)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    share = min(1.0, (total - free + 2**30) / total)
    return {"backend": "cuda", "gpu_memory_utilization": share, "batch_invariant": True, **settings}


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params)]


class Continuation:
    """Drafts each sequence's known greedy continuation, every third proposal with a wrong last token."""

    def __init__(self, script: dict[tuple[int, ...], list[int]]) -> None:
        self.script, self.calls = script, 0

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        drafts = []
        for seq, k in zip(seqs, max_tokens, strict=True):
            self.calls += 1
            future = self.script[tuple(seq.token_ids[: seq.num_prompt_tokens])][len(seq.output_ids) :][:k]
            if self.calls % 3 == 0 and future:
                future = [*future[:-1], (future[-1] + 1) % 256]
            drafts.append(future)
        return drafts

    def release(self, seq: Sequence) -> None:
        return None


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "qwen3_next", "nemotron_h"])
def test_verified_drafts_give_the_plain_greedy_tokens(name: str) -> None:
    """Scripted drafts, every third with a wrong last token; on the hybrid models the rejected drafts' state is
    restored from the checkpoints the verify graphs wrote."""
    plain = LLM(TINY / name, **on_gpu())
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=6)
    want = _tokens(plain, prompts)
    spec = LLM(TINY / name, **on_gpu(num_speculative_tokens=3))
    assert spec.engine.speculation is not None
    spec.engine.speculation.proposer = Continuation({tuple(p): w for p, w in zip(prompts, want, strict=True)})
    assert _tokens(spec, prompts) == want
    stats = spec.engine.runner.spec_stats
    assert 0 < stats.accepted < stats.proposed
    graphs = spec.engine.runner.decode_graphs
    assert graphs is not None and graphs.verify_graphs and not graphs.verify_failed  # uniform verify steps replay
    assert_no_leaks(spec)


class Recorded:
    """The drafts an `MtpProposer` hands out, by the sequence's tokens at the time."""

    def __init__(self, llm: LLM) -> None:
        assert llm.engine.speculation is not None
        proposer = llm.engine.speculation.proposer
        assert isinstance(proposer, MtpProposer)
        self.drafts: dict[tuple[int, ...], list[int]] = {}
        original = proposer.propose

        def propose(seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
            out = original(seqs, max_tokens)
            self.drafts.update({tuple(seq.token_ids): draft for seq, draft in zip(seqs, out, strict=True)})
            return out

        proposer.propose = propose  # type: ignore[method-assign]


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_mtp_on_captured_steps(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first decode steps (``min_tokens`` pending: no drafts) replay captured graphs, whose final
    hidden states the MTP layer reads; then drafts are verified. Tokens equal plain decoding's and the
    drafts equal an engine's that decodes eagerly."""
    params = SamplingParams(temperature=0, min_tokens=5, max_tokens=16, ignore_eos=True)
    plain = LLM(TINY / name, **on_gpu(enable_prefix_caching=False))
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=4, max_tail_length=30)
    want = _tokens(plain, prompts, params)
    graphed = LLM(TINY / name, **on_gpu(enable_prefix_caching=False, speculative_config=MTP))
    graphed_drafts = Recorded(graphed)
    assert _tokens(graphed, prompts, params) == want
    graphs = graphed.engine.runner.decode_graphs
    assert graphs is not None and graphs.replays > 0 and graphs.verify_graphs and not graphs.verify_failed
    assert graphed.engine.runner.spec_stats.proposed > 0
    monkeypatch.setenv("ATLAS_CUDA_GRAPHS", "0")
    eager = LLM(TINY / name, **on_gpu(enable_prefix_caching=False, speculative_config=MTP))
    eager_drafts = Recorded(eager)
    assert eager.engine.runner.decode_graphs is None
    assert _tokens(eager, prompts, params) == want
    assert graphed_drafts.drafts == eager_drafts.drafts
    assert_no_leaks(graphed)


def test_draft_model_steps_replay_graphs() -> None:
    """A self-draft (the target as its own draft model: every draft accepted) gives the plain tokens; its
    one-token steps replay the draft model's graphs and the uniform verify steps the target's."""
    plain = LLM(TINY / "llama", **on_gpu())
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=3)
    want = _tokens(plain, prompts)
    config = {"method": "draft_model", "model": str(TINY / "llama"), "num_speculative_tokens": 3}
    spec = LLM(TINY / "llama", **on_gpu(speculative_config=config))
    assert _tokens(spec, prompts) == want
    stats = spec.engine.runner.spec_stats
    assert stats.accepted == stats.proposed > 0
    speculation = spec.engine.speculation
    assert speculation is not None
    draft_graphs = speculation.proposer.graphs  # type: ignore[attr-defined]
    assert draft_graphs is not None and draft_graphs.replays > 0
    assert spec.engine.runner.decode_graphs is not None and spec.engine.runner.decode_graphs.verify_graphs
    assert_no_leaks(spec)
