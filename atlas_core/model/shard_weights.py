"""`ShardedWeights`: how a family loader reads a rank's part of each weight when a model is split over
ranks (`atlas_core.model.sharding`), and the layer wrappers that complete a split layer's output.

`ModelWeightLoader` inherits it; a loader calls `weight_part` / `float_part` with the ranges its
`shard` gives, so only those bytes are read from the checkpoint, and wraps split layers with
`reduced_mixer` / `reduced_feed_forward`. With one rank every range is the whole tensor, every wrapper
the layer itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.parallel import ReducedFeedForward, ReducedMixer, VocabParallelHead
from atlas_core.model.sharding import ShardPlan, TensorParallel
from atlas_core.model.transformer import FeedForward, Mixer
from atlas_core.weights.quantized import QuantizedWeight, as_float, quantized_part
from atlas_core.weights.source import WeightSource, quantized_tensor, tensor_part, tensor_shape


class ShardedWeights:
    """A rank's view of a checkpoint (mixed into `ModelWeightLoader`, which provides the attributes and
    the whole-weight readers declared here)."""

    source: WeightSource
    backend: Backend
    origin: str
    parallel: TensorParallel | None

    if TYPE_CHECKING:

        def tensor(self, name: str) -> np.ndarray: ...

        def linear_weight(self, name: str) -> np.ndarray | QuantizedWeight: ...

        def upload(self, *names: str) -> Array | QuantizedWeight: ...

        def upload_arrays(self, *arrays: np.ndarray | QuantizedWeight) -> Array | QuantizedWeight: ...

        def optional_upload(self, present: bool, *names: str) -> Array | None: ...

    @property
    def shard(self) -> ShardPlan:
        """This rank's shard plan (the whole model when not split)."""
        return ShardPlan() if self.parallel is None else self.parallel.plan

    def weight_part(self, name: str, *index: range | slice) -> np.ndarray | QuantizedWeight:
        """This rank's part of weight ``name``: ``index`` gives a range (or slice) per leading axis, and only
        that part is read (`tensor_part`). When ``index`` covers the whole weight, the weight as stored
        (`linear_weight`, quantized ones kept quantized); on a model that is not split ``index`` must cover
        it (ranges from `shard`), and is not looked at. `float_part` reads any part."""
        if not self.shard.is_split or all(i == slice(None) for i in index):
            return self.linear_weight(name)
        shape = self.weight_shape(name)
        if all(_covers(i, size) for i, size in zip(index, shape, strict=False)):
            return self.linear_weight(name)
        quantized = quantized_tensor(self.source, name)
        slices = tuple(slice(i.start, i.stop) if isinstance(i, range) else i for i in index)
        if quantized is not None:
            try:
                return quantized_part(quantized, slices)
            except ValueError as exc:
                raise ModelLoadError(f"{self.origin}: {name!r} cannot be split over ranks: {exc}") from exc
        return tensor_part(self.source, name, slices)

    def float_part(self, name: str, *index: range | slice) -> np.ndarray:
        """The float values (`tensor`) of part ``index`` of ``name`` (a range or slice per leading axis), for
        weights a loader rearranges arithmetically: only that part is read, except that a quantized weight
        is dequantized whole and then cut."""
        slices = tuple(slice(i.start, i.stop) if isinstance(i, range) else i for i in index)
        if name not in self.source:
            raise ModelLoadError(f"{self.origin}: weight {name!r} is missing from the checkpoint")
        if quantized_tensor(self.source, name) is not None:
            return np.ascontiguousarray(self.tensor(name)[slices])
        return tensor_part(self.source, name, slices)

    def weight_shape(self, name: str) -> tuple[int, ...]:
        """Weight ``name``'s shape as stored (`tensor_shape`), or a `ModelLoadError` naming it."""
        if name not in self.source:
            raise ModelLoadError(f"{self.origin}: weight {name!r} is missing from the checkpoint")
        return tensor_shape(self.source, name)

    def row_parallel_bias(self, present: bool, name: str) -> Array | None:
        """The bias ``name`` of a row-parallel projection (one whose ranks' outputs are summed): uploaded on
        rank 0 only, so the sum adds it once; None when not ``present``."""
        return self.optional_upload(present and self.shard.rank == 0, name)

    def reduced_mixer(self, mixer: Mixer) -> Mixer:
        """``mixer`` completed by an all-reduce of the ranks' partial outputs when attention is split
        (`ShardPlan.tensor_split`)."""
        if self.parallel is None or not self.shard.tensor_split:
            return mixer
        return ReducedMixer(mixer, self.parallel.comm)

    def reduced_feed_forward(self, ffn: FeedForward) -> FeedForward:
        """``ffn`` completed by an all-reduce of the ranks' partial outputs when dense layers are split
        (`ShardPlan.tensor_split`); MoE blocks reduce themselves (`load_moe`)."""
        if self.parallel is None or not self.shard.tensor_split:
            return ffn
        return ReducedFeedForward(ffn, self.parallel.comm)

    def lm_head(self, name: str) -> Array | QuantizedWeight:
        """The LM head ``name``: the whole weight as stored, or this rank's rows of a split model (`vocab_rows`)."""
        return self.upload(name) if not self.shard.tensor_split else self.vocab_rows(name)[0]

    def vocab_rows(self, name: str) -> tuple[Array, VocabParallelHead | None]:
        """The embedding or LM-head table ``name`` (``[vocab, H]``) and, when the model is split, the
        `VocabParallelHead` for this rank's rows (the table is then those rows, zero-padded to an equal
        count per rank). An embedding is never kept quantized."""
        if self.parallel is None or not self.shard.tensor_split:
            return self.upload_arrays(self.tensor(name)), None
        vocab_size = self.weight_shape(name)[0]
        ids, per_rank = self.shard.vocab(vocab_size)
        rows = as_float(self.weight_part(name, ids))  # a quantized LM head is dequantized: its rows are padded
        padded = np.zeros((per_rank, *rows.shape[1:]), dtype=rows.dtype)
        padded[: len(rows)] = rows
        return self.upload_arrays(padded), VocabParallelHead(self.backend, self.parallel.comm, ids, vocab_size)


def _covers(index: range | slice, size: int) -> bool:
    """Whether ``index`` (a range or slice of one axis) takes the whole axis of ``size``."""
    return range(size)[index] == range(size) if isinstance(index, slice) else index == range(size)
