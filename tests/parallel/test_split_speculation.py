"""Model-based speculation on a model split over ranks: the MTP head is built on every rank (split like
the target) and its steps are posted like the target's forwards, so TP=2 drafts what the unsplit head
drafts and keeps the greedy tokens; a draft model runs whole on rank 0 alone and its drafts are verified by
split forwards."""

from __future__ import annotations

from typing import Any

from atlas_core import LLM
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.spec.mtp import MtpProposer
from tests.conftest import TINY
from tests.test_speculative_mtp import RecordedDrafts

PROMPTS = [[1, 7, 42, 9, 100], [3, 5], [200, 4, 4, 4]]
LONG = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
KV_GIB = 1 / 64


def run(folder: Any, **kwargs: Any) -> tuple[list[list[int]], tuple[int, int], dict[Any, list[int]]]:
    """Greedy tokens of `PROMPTS`, the (proposed, accepted) draft counts and, with MTP, the drafts by the
    tokens they followed, of an `LLM` with ``kwargs``."""
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB, **kwargs) as llm:
        proposer = llm.engine.speculation.proposer if llm.engine.speculation else None
        recorded = RecordedDrafts(proposer) if isinstance(proposer, MtpProposer) else None
        tokens = [output.outputs[0].token_ids for output in llm.generate(PROMPTS, LONG)]
        stats = llm.engine.runner.spec_stats
        return tokens, (stats.proposed, stats.accepted), recorded.drafts if recorded else {}


def test_mtp_speculation_runs_split_and_drafts_as_the_whole_head() -> None:
    folder, mtp = TINY / "qwen3_next", {"method": "mtp", "num_speculative_tokens": 2}
    plain, _, _ = run(folder)
    whole, whole_stats, whole_drafts = run(folder, speculative_config=mtp)
    split, split_stats, split_drafts = run(folder, speculative_config=mtp, tensor_parallel_size=2)
    assert split == whole == plain
    assert split_stats == whole_stats and split_stats[0] > 0
    assert split_drafts == whole_drafts  # the split head drafts what the whole head drafts


def test_draft_model_speculation_runs_split() -> None:
    folder = TINY / "llama"
    draft = {"method": "draft_model", "model": str(folder), "num_speculative_tokens": 3}
    plain, _, _ = run(folder)
    split, (proposed, accepted), _ = run(folder, speculative_config=draft, tensor_parallel_size=2)
    assert split == plain
    assert accepted == proposed > 0  # the draft is the target: split verification accepts every draft
