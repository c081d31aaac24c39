"""Multi-token prediction (MTP) heads: the extra layers some checkpoints carry to guess the token after
next (Qwen3-Next / Qwen3.5 / Qwen3.6 ``mtp.*``), used as speculative-decoding proposers
(`atlas_core.engine.spec.mtp`).

One MTP step at position ``p`` combines the target model's final hidden state ``h_p`` (the one that
predicted token ``p + 1``) with the embedding of token ``p + 1`` and predicts token ``p + 2``::

    x = fc([embed_norm(embed(t[p+1])), hidden_norm(h_p)])     # fc: [H, 2H], embedding half first
    y = final_norm(decoder_layer(x))                           # one full-attention decoder layer
    logits = lm_head(y)                                        # the target's head, shared

``y`` stands in for ``h`` in the next chained step (``p + 1`` with the drafted token). DeepSeek-V3's MTP
layers (``model.layers.{num_hidden_layers + k}``: ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head``)
compute the same, but chain the layer's output before ``final_norm`` (``MtpLayer.norm_in_logits``, as
vLLM's ``deepseek_mtp``), and may carry their own embedding and LM head. ``h_p`` is always the
target's normed final hidden state. The decoder layers' KV lives in the target's paged cache, after
the target's layers: a family builds layer ``i``'s attention with ``kv_index = len(target.kv_layouts) +
i`` and lists its layouts in ``kv_layouts``. A family offers its heads by giving its
`ModelWeightLoader` a ``build_mtp`` method (`MtpLoader`).

On a model split over ranks every rank builds its shard of the head (`load_mtp_head` with the rank's
`TensorParallel`: the layers split like the target's), and rank 0's head posts each forward and each
logits call through the target's mirror, so the other ranks run the same steps in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import AnyKVLayout, KVCache
from atlas_core.errors import ConfigError
from atlas_core.model.load import LoadedModel, open_source
from atlas_core.model.sharding import TensorParallel
from atlas_core.model.transformer import DecoderLayer, Norm, TransformerModel
from atlas_core.plugins import get_registry


@dataclass
class MtpLayer:
    """One MTP depth: the input norms, ``fc`` split into its embedding half ``fc_embed`` and hidden half
    ``fc_hidden`` (``[H, H]`` each), the decoder layer and its output norm.

    ``norm_in_logits``: False (Qwen3-Next): ``final_norm`` ends the step, and the normed rows feed both
    the LM head and the next chained step; True (DeepSeek-V3): the step ends with the layer's residual
    stream, which feeds the next chained step, and ``final_norm`` applies on the way to the LM head.
    ``embed_tokens`` / ``lm_head``: the layer's own tables (``[V, H]``, split like the target's), or None
    for the target's."""

    embed_norm: Norm
    hidden_norm: Norm
    fc_embed: Array
    fc_hidden: Array
    layer: DecoderLayer
    final_norm: Norm
    norm_in_logits: bool = False
    embed_tokens: Array | None = None
    lm_head: Array | None = None


class MtpHead:
    """A model's MTP layers over the target's embedding and LM head (see the module docstring).

    ``kv_layouts``: one KV layout per MTP layer (appended to the target's in the engine's cache).
    Chained step ``k`` (0-based) runs layer ``k % len(layers)``, as checkpoints with one layer reuse it
    for every step.
    """

    def __init__(
        self, backend: Backend, target: TransformerModel, layers: Sequence[MtpLayer], kv_layouts: Sequence[AnyKVLayout]
    ) -> None:
        if not layers or len(layers) != len(kv_layouts):
            raise ValueError(f"an MTP head needs one KV layout per layer, got {len(layers)} and {len(kv_layouts)}")
        self.backend, self.target = backend, target
        self.layers, self.kv_layouts = list(layers), list(kv_layouts)

    def forward(self, step: int, batch: ForwardBatch, kv: KVCache) -> Array:
        """MTP layer ``step % len(layers)`` over the batch: ``batch.input_ids[T]`` (token ``p + 1`` of each
        row) and ``batch.input_hidden[T, H]`` (``h_p``) -> the output rows ``[T, H]``, normed unless the
        layer's ``norm_in_logits`` (`logits` of them predict token ``p + 2``; they are the
        ``input_hidden`` of the next chained step). ``batch`` positions are the ``p``. On rank 0 of a split
        model the step is posted to the other ranks first (`ModelMirror.forward`)."""
        if batch.input_hidden is None:
            raise ValueError("an MTP step reads batch.input_hidden: the target's hidden state of each token")
        mirror = self.target.mirror
        if mirror is not None:
            return mirror.forward(batch, lambda: self._forward(step, batch, kv), mtp_step=step)
        return self._forward(step, batch, kv)

    def _forward(self, step: int, batch: ForwardBatch, kv: KVCache) -> Array:
        assert batch.input_hidden is not None  # forward() checked it
        mtp = self.layers[step % len(self.layers)]
        embedded, _ = mtp.embed_norm(self._embed(mtp, batch.input_ids))
        normed_hidden, _ = mtp.hidden_norm(batch.input_hidden)
        # fc over the concatenation == the sum of its halves; the layer's input norm adds them (residual form)
        x = self.backend.linear(embedded, mtp.fc_embed)
        residual = self.backend.linear(normed_hidden, mtp.fc_hidden)
        out, residual_out = mtp.layer(x, residual, batch, kv)
        normed, stream = mtp.final_norm(out, residual_out)
        return stream if mtp.norm_in_logits else normed

    def logits(self, hidden: Array, step: int = 0) -> Array:
        """``[S, H]`` output rows of chained step ``step`` -> ``[S, V]`` logits through the layer's LM head
        (the target's unless the layer has its own)."""
        mtp = self.layers[step % len(self.layers)]
        if mtp.norm_in_logits:
            hidden = mtp.final_norm(hidden)[0]
        if mtp.lm_head is None:
            return self.target.compute_logits(hidden)  # posted by a split target's mirror
        mirror = self.target.mirror
        if mirror is not None:
            return mirror.logits(hidden, lambda rows: self.own_logits(rows, step), mtp_step=step)
        return self.own_logits(hidden, step)

    def own_logits(self, hidden: Array, step: int) -> Array:
        """``hidden`` rows (normed as `logits` norms them) through the own LM head of chained step ``step``'s
        layer (split by vocabulary like the target's, whose logits it gathers)."""
        mtp = self.layers[step % len(self.layers)]
        assert mtp.lm_head is not None, "own_logits is for MTP layers with their own LM head"
        split = self.target.vocab_split
        return self.backend.linear(hidden, mtp.lm_head) if split is None else split.logits(hidden, mtp.lm_head)

    def _embed(self, mtp: MtpLayer, input_ids: Array) -> Array:
        if mtp.embed_tokens is None:
            return self.target.embed(input_ids)
        split = self.target.vocab_split
        table = mtp.embed_tokens
        return self.backend.embedding(table, input_ids) if split is None else split.embed(table, input_ids)

    def steps(self) -> list[MtpStep]:
        """Each MTP layer as a model of its own (`MtpStep`); chained step ``k`` runs ``steps()[k % len]``."""
        return [MtpStep(self, i) for i in range(len(self.layers))]


class MtpStep:
    """One MTP layer in the shape of a model, so that a backend's decode graphs (`Backend.decode_graphs`)
    capture its steps as they capture a model's: ``forward(batch, kv)`` and ``compute_logits``, over
    batches that carry ``input_hidden`` (``input_hidden_size`` wide)."""

    has_recurrent_state = False

    def __init__(self, head: MtpHead, index: int) -> None:
        self.head, self.index = head, index
        self.max_position_embeddings = head.target.max_position_embeddings
        self.input_hidden_size = int(head.layers[index].fc_hidden.shape[1])

    def forward(self, batch: ForwardBatch, kv: KVCache) -> Array:
        return self.head.forward(self.index, batch, kv)

    def compute_logits(self, hidden: Array) -> Array:
        return self.head.logits(hidden, self.index)


@runtime_checkable
class MtpLoader(Protocol):
    """A `ModelWeightLoader` of a family whose checkpoints may carry MTP layers."""

    def build_mtp(self, target: TransformerModel) -> MtpHead:
        """The checkpoint's MTP head over the already built ``target``; `ConfigError` when the
        checkpoint has no MTP weights."""
        ...

    @classmethod
    def mtp_checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of what `build_mtp` reads (random-weights benchmarks)."""
        ...


def load_mtp_head(
    target: LoadedModel, backend: Backend, max_seq_len: int, parallel: TensorParallel | None = None
) -> MtpHead:
    """The MTP head of ``target``'s checkpoint (its family's ``build_mtp``), position tables ``max_seq_len``
    long; ``parallel``: this rank's shard of it, split as ``target`` is. `ConfigError` when the family or
    the checkpoint has none."""
    registry = get_registry()
    model_type = str(target.config.get("model_type"))
    registration = registry.find("model", model_type)
    origin = str(target.resolved.path)
    if registration is None:
        raise no_mtp_error(origin, model_type)
    source = target.source or open_source(target.resolved)
    loader = registration.load()(source, backend, registry, origin, max_seq_len, parallel)
    if not isinstance(loader, MtpLoader):
        raise no_mtp_error(origin, model_type)
    return loader.build_mtp(target.model)


def no_mtp_error(origin: str, family: str) -> ConfigError:
    """The error for a speculative method ``mtp`` on a checkpoint or family without MTP layers."""
    return ConfigError(
        f"{origin}: speculative method 'mtp' needs the checkpoint's multi-token-prediction layers, and the "
        f"{family} checkpoint has none; use method 'ngram' or 'draft_model' instead"
    )
