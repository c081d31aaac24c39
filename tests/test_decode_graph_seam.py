"""The runner hands pure-decode steps to a backend's captured decode graphs, and only those."""

from __future__ import annotations

from typing import Any

from atlas_core import LLM, SamplingParams
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.batch.forward_batch import ForwardBatch
from tests.conftest import TINY, reference


class RecordingGraphs:
    """Stands in for captured CUDA graphs: runs the eager forward, records every batch it got."""

    def __init__(self, model: Any, kv: Any, max_batch: int) -> None:
        self.model, self.kv, self.max_batch = model, kv, max_batch
        self.batches: list[ForwardBatch] = []

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.attention.seq_lens.shape[0] <= self.max_batch

    def run(self, batch: ForwardBatch) -> Any:
        self.batches.append(batch)
        hidden = self.model.forward(batch, self.kv)
        return self.model.compute_logits(hidden[batch.logits_rows])


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
    for batch in graphs.batches:
        assert batch.is_pure_decode and batch.num_tokens <= 4
        assert batch.num_tokens == len(batch.logits_rows)
