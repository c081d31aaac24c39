"""Layer wrappers for tensor and expert parallelism (`atlas_core.model.sharding` says what each rank holds).

A rank's attention holds its heads and the matching columns of the output projection (row-parallel),
a feed-forward its intermediate rows and the matching columns of the down projection: each gives a
partial sum of the layer's output, which `ReducedMixer` / `ReducedFeedForward` complete with one
all-reduce. Biases added after a row-parallel projection are kept by rank 0 alone.
"""

from __future__ import annotations

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.comm import CommBackend
from atlas_core.model.transformer import FeedForward, Mixer


class ReducedMixer:
    """A token mixer whose ranks each give a partial output: ``all_reduce(mixer(x))``."""

    def __init__(self, mixer: Mixer, comm: CommBackend) -> None:
        self.mixer, self.comm = mixer, comm

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        return self.comm.all_reduce(self.mixer(x, batch, kv))


class ReducedFeedForward:
    """A feed-forward block whose ranks each give a partial output: ``all_reduce(ffn(x))``."""

    def __init__(self, ffn: FeedForward, comm: CommBackend) -> None:
        self.ffn, self.comm = ffn, comm

    def __call__(self, x: Array) -> Array:
        return self.comm.all_reduce(self.ffn(x))


class VocabParallelHead:
    """The embedding and LM head split by vocabulary rows: this rank holds token ids ``ids``
    (``embed_tokens`` and ``lm_head`` are ``[rows_per_rank, H]``, zero rows past the vocabulary).

    ``embed``: each rank looks up the ids it holds (zeros for the others), and an all-reduce gives
    every rank the full rows. ``logits``: each rank projects onto its rows, and an all-gather along
    the vocabulary gives ``[S, vocab_size]``.
    """

    def __init__(self, backend: Backend, comm: CommBackend, ids: range, vocab_size: int) -> None:
        self.backend, self.comm = backend, comm
        self.ids, self.vocab_size = ids, vocab_size

    def embed(self, table: Array, input_ids: Array) -> Array:
        """``[T]`` token ids -> ``[T, H]`` embeddings from this rank's rows ``table``."""
        local = input_ids - self.ids.start
        held = (local >= 0) & (local < len(self.ids))
        rows = self.backend.embedding(table, local * held)
        rows *= held[:, None].astype(rows.dtype)
        return self.comm.all_reduce(rows)

    def logits(self, hidden: Array, lm_head: Array) -> Array:
        """``[S, H]`` hidden rows -> ``[S, vocab_size]`` logits from this rank's rows ``lm_head``."""
        return self.comm.all_gather(self.backend.linear(hidden, lm_head), axis=1)[:, : self.vocab_size]
