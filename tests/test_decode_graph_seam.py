"""The runner hands pure-decode steps to a backend's captured decode graphs, and only those."""

from __future__ import annotations

from typing import Any

from atlas_example_plugin.backend import EagerDecodeGraphs

from atlas_core import LLM, SamplingParams
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.testing.family import mixed_prompts
from tests.conftest import TINY, reference
from tests.test_speculative_mtp import MTP, RecordedDrafts, mtp_llm


class RecordingGraphs(EagerDecodeGraphs):
    """Stands in for captured CUDA graphs: runs the eager forward, records every batch it got."""

    def __init__(self, model: Any, kv: Any, max_batch: int) -> None:
        super().__init__(model, kv)
        self.max_batch = max_batch
        self.batches: list[ForwardBatch] = []

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.attention.seq_lens.shape[0] <= self.max_batch

    def run(self, batch: ForwardBatch) -> Any:
        self.batches.append(batch)
        return super().run(batch)  # every row's logits, as captured graphs give them


def test_pure_decode_steps_use_graphs_and_results_are_unchanged(monkeypatch: Any) -> None:
    created: list[RecordingGraphs] = []

    def decode_graphs(self: NumpyBackend, model: Any, kv: Any) -> RecordingGraphs:
        created.append(RecordingGraphs(model, kv, max_batch=4))
        return created[-1]

    monkeypatch.setattr(NumpyBackend, "decode_graphs", decode_graphs)
    llm = LLM(TINY / "llama", backend="numpy")
    ref = reference("llama")
    prompts = [ref[f"prompt_{i}"].tolist() for i in range(4)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outputs] == [ref[f"greedy_{i}"].tolist() for i in range(4)]
    graphs = created[0]
    assert graphs.batches, "no pure-decode step reached the graphs"
    for batch in graphs.batches:  # one token per sequence, or as many for each
        assert batch.is_pure_decode or batch.tokens_per_seq * len(batch.attention.seq_lens) == batch.num_tokens
        assert len(batch.attention.seq_lens) <= 4


def test_mtp_reads_the_hidden_states_of_captured_steps(monkeypatch: Any) -> None:
    """MTP speculation where the first decode steps go through the graphs (``min_tokens`` pending: no
    drafts): the MTP layer reads their hidden states from the graphs, and its own steps replay graphs of
    their own; the drafts equal those of an engine without graphs, and the tokens plain decoding's."""
    created: list[RecordingGraphs] = []

    def decode_graphs(self: NumpyBackend, model: Any, kv: Any) -> RecordingGraphs:
        created.append(RecordingGraphs(model, kv, max_batch=8))
        return created[-1]

    params = SamplingParams(temperature=0, min_tokens=6, max_tokens=14, ignore_eos=True)
    plain = LLM(TINY / "qwen3_next", backend="numpy", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=3, max_tail_length=20)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    eager, eager_drafts = mtp_llm("qwen3_next", backend="numpy", enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in eager.generate(prompts, params)] == want
    monkeypatch.setattr(NumpyBackend, "decode_graphs", decode_graphs)
    graphed = LLM(TINY / "qwen3_next", backend="numpy", enable_prefix_caching=False, speculative_config=MTP)
    assert graphed.engine.speculation is not None
    graphed_drafts = RecordedDrafts(graphed.engine.speculation.proposer)  # type: ignore[arg-type]
    assert [o.outputs[0].token_ids for o in graphed.generate(prompts, params)] == want
    target_graphs, mtp_graphs = sorted(created, key=lambda graphs: graphs.model is not graphed.loaded.model)
    assert any(b.is_pure_decode for b in target_graphs.batches), "no decode step went through the graphs"
    assert any(b.tokens_per_seq >= 3 for b in target_graphs.batches), "no uniform verify step reached the graphs"
    # the MTP layer's own steps (an MtpStep looks like a model to the backend's graphs)
    assert any(b.is_pure_decode and b.input_hidden is not None for b in mtp_graphs.batches)
    assert graphed_drafts.drafts == eager_drafts.drafts and any(graphed_drafts.drafts.values())


def test_draft_model_steps_go_through_the_graphs(monkeypatch: Any) -> None:
    """A draft model's greedy steps of one token per sequence replay the backend's decode graphs of the
    draft model; the tokens equal plain decoding's (a self-draft: every draft accepted)."""
    from atlas_core.engine.spec.draft_model import DraftModelProposer

    created: list[RecordingGraphs] = []

    def decode_graphs(self: NumpyBackend, model: Any, kv: Any) -> RecordingGraphs:
        created.append(RecordingGraphs(model, kv, max_batch=8))
        return created[-1]

    plain = LLM(TINY / "qwen3", backend="numpy", enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=3, max_tail_length=20)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    monkeypatch.setattr(NumpyBackend, "decode_graphs", decode_graphs)
    config = {"method": "draft_model", "model": str(TINY / "qwen3"), "num_speculative_tokens": 3}
    spec = LLM(TINY / "qwen3", backend="numpy", speculative_config=config)
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == want
    assert spec.engine.speculation is not None and isinstance(spec.engine.speculation.proposer, DraftModelProposer)
    draft_graphs = [g for g in created if g.model is spec.engine.speculation.proposer.draft.model]
    assert draft_graphs and any(b.is_pure_decode for b in draft_graphs[0].batches)
    stats = spec.engine.runner.spec_stats
    assert stats.accepted == stats.proposed > 0
