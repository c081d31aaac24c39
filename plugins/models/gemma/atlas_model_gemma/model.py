"""Gemma models: `TransformerModel` with scaled input embeddings, optional final logit soft-capping,
and (Gemma 4) per-layer inputs handed to every decoder layer, and Gemma 4's handling of image tokens."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any, cast

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.transformer import TransformerModel
from atlas_model_gemma.layers import Gemma4DecoderLayer
from atlas_model_gemma.ops import GemmaOps
from atlas_model_gemma.per_layer_inputs import PerLayerInputs, in_activation_dtype


class GemmaModel(TransformerModel):
    """Embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the activation dtype; logits are
    soft-capped, ``cap * tanh(logits / cap)``, when ``final_logit_softcapping`` is set."""

    def __init__(
        self, backend: Backend, *, hidden_size: int, final_logit_softcapping: float | None, **kwargs: Any
    ) -> None:
        super().__init__(backend, **kwargs)
        self.embed_scale = in_activation_dtype(backend, hidden_size**0.5)
        self.final_logit_softcapping = final_logit_softcapping

    def embed(self, input_ids: Array) -> Array:
        """``[T]`` token ids -> scaled ``[T, H]`` input embeddings."""
        return self.backend.ops(GemmaOps).scale(super().embed(input_ids), self.embed_scale)

    def compute_logits(self, hidden: Array) -> Array:
        logits = super().compute_logits(hidden)
        cap = self.final_logit_softcapping
        return logits if cap is None else self.backend.ops(GemmaOps).soft_cap(logits, cap)


class Gemma4Model(GemmaModel):
    """Gemma 4: layers are `Gemma4DecoderLayer`s, each given its slice of the per-layer inputs.

    A batch with image features (``batch.visual``) is read as transformers' ``Gemma4Model`` reads it: the
    image tokens' ids become ``pad_token_id`` before anything is embedded (so the per-layer inputs' token
    part at an image token is the pad token's), the features replace the scaled embeddings of those rows,
    and the per-layer inputs' context part is computed from the embeddings with the features in place.
    Where images attend bidirectionally (``batch.attention.visible_end``), only sliding-window layers see
    ahead: the layers in ``full_attention_layers`` stay causal (transformers' ``create_masks_for_vision_model``).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        per_layer_inputs: PerLayerInputs | None,
        full_attention_layers: Collection[int] = (),
        pad_token_id: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(backend, **kwargs)
        self.per_layer_inputs = per_layer_inputs
        self.full_attention_layers = frozenset(full_attention_layers)
        self.pad_token_id = pad_token_id

    def _forward(self, batch: ForwardBatch, kv: KVCache) -> Array:  # `forward` (and a split model's mirror) calls it
        ids, visual = batch.input_ids, batch.visual
        if visual is not None:
            ids = ids.copy()
            ids[visual.rows] = self.pad_token_id
        hidden, residual = self.embed(ids), None
        if visual is not None:
            hidden[visual.rows] = visual.embeds
        inputs = None if self.per_layer_inputs is None else self.per_layer_inputs(ids, hidden)
        causal = batch
        if batch.attention.visible_end is not None and self.full_attention_layers:
            causal = replace(batch, attention=replace(batch.attention, visible_end=None))
        for i, layer in enumerate(cast("list[Gemma4DecoderLayer]", self.layers)):
            layer_batch = causal if i in self.full_attention_layers else batch
            hidden, residual = layer(hidden, residual, layer_batch, kv, None if inputs is None else inputs[:, i])
        return self.final_norm(hidden, residual)[0]
