"""`DecodeGraphs`: the seam through which a backend offers captured decode steps to the engine's runner
(`atlas_core.engine.runner`)."""

from __future__ import annotations

from typing import Protocol

from atlas_core.backends.base import Array
from atlas_core.batch.forward_batch import ForwardBatch


class DecodeGraphs(Protocol):
    """Captured pure-decode forwards over fixed buffers, one per batch-size bucket (CUDA graphs), and,
    where the backend captures them too, steps of as many tokens per sequence (`ForwardBatch.tokens_per_seq`:
    speculative decoding's verify steps, short prefill chunks).

    A backend offers them through ``Backend.decode_graphs(model, kv)``; results must equal the
    eager forward's.
    """

    def can_run(self, batch: ForwardBatch) -> bool:
        """True when a captured graph serves this batch (pure decode, or a uniform verify step)."""
        ...

    last_hidden: Array | None
    """The final hidden states ``[T, H]`` of the last `run` (valid until the next one); speculative
    proposers that read hidden states (MTP) use them. None: the backend does not keep them."""

    def run(self, batch: ForwardBatch) -> Array:
        """Replay: the logits ``[T, V]`` of every token of the batch."""
        ...

    def captures(self, batch: ForwardBatch) -> bool:
        """Whether `run` of ``batch`` captures a graph first (none of its bucket yet), which waits for the device
        to be idle: a split replica then waits for every earlier step, bounded, before it (optional; without it a
        split replica assumes every step may capture)."""
        ...

    def close(self) -> None:
        """Release the captured graphs (a split model's before its communicator closes: NCCL waits for the
        graphs holding its collectives to be gone); `run` may capture again afterwards."""
        ...
