"""`TransformerModel`: embed -> decoder layers -> final norm -> lm_head, over a `ForwardBatch`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import AnyKVLayout, KVCache
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.vision import VisionModel


class Mixer(Protocol):
    """The token-mixing half of a decoder layer (attention, or a recurrent mixer in hybrid models):
    ``x[T, H] -> [T, H]`` for the batch's tokens, reading and writing its own KV cache slot or state."""

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array: ...


class Norm(Protocol):
    """A normalisation layer (``rms_norm``, or a family's variant of it) with the residual add fused
    in: ``norm(x, residual=None) -> (normed, stream)``, where ``stream = x + residual`` (``x`` alone
    without ``residual``) is the residual stream to carry on and ``normed`` is ``stream`` normalised
    over its last axis. Shapes are kept (``[T, H]``, or ``[T, heads, D]`` for per-head norms)."""

    def __call__(self, x: Array, residual: Array | None = None) -> tuple[Array, Array]: ...


class FeedForward(Protocol):
    """The channel-mixing half of a decoder layer (``swiglu_mlp``, ``geglu_mlp``, ``relu2_mlp``,
    ``moe``): ``x[T, H] -> [T, H]``, each token on its own, with no cache or state."""

    def __call__(self, x: Array) -> Array: ...


class VocabSplit(Protocol):
    """The embedding and LM head of a model split by vocabulary over ranks
    (`atlas_core.model.layers.parallel.VocabParallelHead`)."""

    def embed(self, table: Array, input_ids: Array) -> Array: ...

    def logits(self, hidden: Array, lm_head: Array) -> Array: ...


class ModelMirror(Protocol):
    """Rank 0's end of a split replica (`atlas_core.parallel.mirror.RankMirror`): it tells the other ranks
    about a call, then runs rank 0's part."""

    def forward(self, batch: ForwardBatch, run: Callable[[], Array], mtp_step: int | None = None) -> Array:
        """Tell the other ranks to run ``batch`` (through the MTP head's chained step ``mtp_step``, when
        given), then ``run()`` rank 0's part."""

    def logits(self, hidden: Array, run: Callable[[Array], Array], mtp_step: int | None = None) -> Array:
        """Share rank 0's ``hidden`` rows with the other ranks (which project them through the model's LM
        head, or that of the MTP head's step ``mtp_step``), then ``run(hidden)``."""

    def state(self, call: str, *args: Any) -> None:
        """Tell the other ranks about recurrent-state call ``call`` (``allocate_state``, ``reset_state``,
        ``copy_state``) with ``args`` (JSON values)."""

    def settle(self) -> None:
        """Wait, bounded, for the last decode step queued ahead (`atlas_core.engine.ahead`) that no later step
        waited for: called before its tokens are read when nothing was queued after it."""


class DecoderLayer(Protocol):
    """One decoder block as `TransformerModel.forward` calls it, over the batch's ``T`` tokens.

    The residual add is deferred into the next block's first norm: a block takes ``(hidden, residual)``
    standing for the stream ``hidden + residual`` (``residual`` None on the first block: ``hidden``
    alone) and returns its output stream in the same two-part form (``residual`` None when it
    materialised the sum itself). Arrays are ``[T, H]``.
    """

    def __call__(
        self, hidden: Array, residual: Array | None, batch: ForwardBatch, kv: KVCache
    ) -> tuple[Array, Array | None]: ...


@dataclass
class PreNormDecoderLayer:
    """``h = x + mixer(norm1(x)); out = h + ffn(norm2(h))`` with the residual adds fused into the norms."""

    input_norm: Norm
    mixer: Mixer
    post_mixer_norm: Norm
    ffn: FeedForward

    def __call__(self, hidden: Array, residual: Array | None, batch: ForwardBatch, kv: KVCache) -> tuple[Array, Array]:
        normed, residual = self.input_norm(hidden, residual)
        mixed = self.mixer(normed, batch, kv)
        normed, residual = self.post_mixer_norm(mixed, residual)
        return self.ffn(normed), residual


class TransformerModel:
    """A decoder-only language model built from backend arrays and composed layers.

    ``layers`` are called in order on the embedded tokens (`DecoderLayer`); ``kv_layouts`` lists one
    KV layout per attention layer (the engine sizes and allocates the paged cache from it). Models
    with recurrent layers pass their `RecurrentState`: the engine then sizes it (`allocate_state`),
    gives each sequence a state slot, and zeroes (`reset_state`) or copies (`copy_state`) slots.
    A rank's shard of a model split by vocabulary passes its ``vocab_split`` (``embed_tokens`` and
    ``lm_head`` are then this rank's rows); rank 0 of a split replica sets `mirror`.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        embed_tokens: Array,
        layers: Sequence[DecoderLayer],
        final_norm: Norm,
        lm_head: Array,
        kv_layouts: Sequence[AnyKVLayout],
        vocab_size: int,
        max_position_embeddings: int,
        recurrent_state: RecurrentState | None = None,
        vocab_split: VocabSplit | None = None,
    ) -> None:
        self.backend = backend
        self.embed_tokens = embed_tokens
        self.layers: list[DecoderLayer] = list(layers)
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.kv_layouts: list[AnyKVLayout] = list(kv_layouts)
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.recurrent_state = recurrent_state
        self.vocab_split = vocab_split
        self.mirror: ModelMirror | None = None
        """Rank 0 of a split replica: posts each forward and logits call to the other ranks first."""
        self.vision: VisionModel | None = None
        """A vision-language model's image side (set by its family's loader); None: the model reads text only."""

    def embed(self, input_ids: Array) -> Array:
        """``[T]`` token ids -> ``[T, H]`` input embeddings (rows of ``embed_tokens``)."""
        if self.vocab_split is not None:
            return self.vocab_split.embed(self.embed_tokens, input_ids)
        return self.backend.embedding(self.embed_tokens, input_ids)

    def forward(self, batch: ForwardBatch, kv: KVCache) -> Array:
        """Final hidden states ``[T, H]`` (already normed) for every token of the batch."""
        if self.mirror is not None:
            return self.mirror.forward(batch, lambda: self._forward(batch, kv))
        return self._forward(batch, kv)

    def _forward(self, batch: ForwardBatch, kv: KVCache) -> Array:
        hidden: Array = self.embed(batch.input_ids)
        visual = batch.visual
        if visual is not None:  # image features replace the placeholder tokens' embeddings
            hidden[visual.rows] = visual.embeds
        residual: Array | None = None
        for index, layer in enumerate(self.layers):
            hidden, residual = layer(hidden, residual, batch, kv)
            if visual is not None and index < len(visual.deepstack):  # the stream is hidden + residual
                hidden[visual.rows] += visual.deepstack[index]
        return self.final_norm(hidden, residual)[0]

    @property
    def has_recurrent_state(self) -> bool:
        """True when some layer keeps per-sequence recurrent state (hybrid and recurrent models)."""
        return self.recurrent_state is not None

    def state_bytes_per_slot(self) -> int:
        """Bytes of recurrent state one state slot takes (0 without recurrent layers)."""
        state = self.recurrent_state
        return 0 if state is None else state.bytes_per_slot(self.backend.activation_dtype)

    def allocate_state(self, num_slots: int) -> None:
        """Create the recurrent state arrays with ``num_slots`` zeroed slots (no-op without recurrent layers)."""
        if self.mirror is not None:
            self.mirror.state("allocate_state", num_slots)
        if self.recurrent_state is not None:
            self.recurrent_state.allocate(self.backend, num_slots)

    def reset_state(self, slot: int) -> None:
        """Zero the recurrent state of ``slot`` before a new sequence uses it."""
        if self.mirror is not None:
            self.mirror.state("reset_state", slot)
        if self.recurrent_state is not None:
            self.recurrent_state.reset(slot)

    def copy_state(self, sources: Sequence[int], destinations: Sequence[int]) -> None:
        """Copy recurrent state slots ``sources[i] -> destinations[i]`` (forks, prefix-cache snapshots)."""
        if self.mirror is not None:
            self.mirror.state("copy_state", list(sources), list(destinations))
        if self.recurrent_state is not None:
            self.recurrent_state.copy(sources, destinations)

    def compute_logits(self, hidden: Array) -> Array:
        """``[S, H]`` hidden rows -> ``[S, V]`` logits in the activation dtype."""
        if self.mirror is not None:
            return self.mirror.logits(hidden, self._logits)
        return self._logits(hidden)

    def _logits(self, hidden: Array) -> Array:
        if self.vocab_split is not None:
            return self.vocab_split.logits(hidden, self.lm_head)
        return self.backend.linear(hidden, self.lm_head)
