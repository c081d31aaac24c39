"""Loaders for DeepSeek-V3 (``deepseek_v3``) and Mistral Small 4 (``mistral4``, and its multimodal
``mistral3`` checkpoints, of which the text stack is loaded).

Each decoder layer is pre-norm MLA attention (`MultiHeadLatentAttention` over a `LatentKVLayout`
cache) followed by a dense SwiGLU MLP (the first ``first_k_dense_replace`` layers) or a
Mixture-of-Experts block (`MoEFeedForward`: routed experts plus the shared experts as one SwiGLU MLP).
Weight preparation at load time:

* ``q_a_proj`` (or ``q_proj``) and ``kv_a_proj_with_mqa`` are fused into one input GEMM;
* with ``rope_interleave`` (the default) the rotary rows of the query and of the shared key are
  reordered from interleaved pairs to rotate-half order (`deinterleave_rope_rows`);
* ``kv_b_proj`` is split per head into the absorbed key and value factors (`split_kv_b`);
* experts are read per expert (``experts.{e}.gate_proj`` ...) or fused (``experts.gate_up_proj``,
  Mistral 4) by `read_experts`.

FP8 checkpoints keep every projection quantized (the fused input GEMM, ``q_b_proj``, ``o_proj``, the
MLPs and the experts) except ``kv_b_proj``: its per-head factors are dequantized at load (the absorbed
form multiplies them per head with ``mla_head_linear``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from atlas_core.batch.kv_cache import LatentKVLayout
from atlas_core.errors import ModelLoadError, UnsupportedArchitectureError
from atlas_core.model.layers.mla import MLAWeights, deinterleave_rope_rows, split_kv_b
from atlas_core.model.layers.moe import MoEFeedForward, load_moe
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.mtp import MtpHead, MtpLayer, no_mtp_error
from atlas_core.model.transformer import DecoderLayer, TransformerModel
from atlas_core.weights.quantized import concat_rows
from atlas_model_deepseek import shapes
from atlas_model_deepseek.spec import DeepseekSpec, Family

TEXT_LAYOUTS = {
    "model.": "lm_head.weight",  # causal LM checkpoints
    "model.language_model.": "lm_head.weight",  # vision-language checkpoints saved by transformers 5
    "language_model.model.": "language_model.lm_head.weight",  # original (llava-style) vision-language layout
}
"""Prefix of the decoder's tensors -> name of the LM head, in the layouts checkpoints use."""


class DeepseekV3Loader(ModelWeightLoader):
    """DeepSeek-V3 / R1 (``deepseek_v3`` checkpoints): sigmoid router with
    ``e_score_correction_bias``. The multi-token-prediction layers past ``num_hidden_layers`` are read
    only for speculative decoding with method ``mtp`` (`build_mtp`)."""

    family: ClassVar[Family] = "deepseek_v3"
    supports_tensor_parallel = True
    supports_expert_parallel = True
    correction_bias: ClassVar[str | None] = "gate.e_score_correction_bias"
    """The router's selection-only bias under each MoE layer's ``mlp.`` (None: routed without one)."""

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads from a causal LM checkpoint (`atlas_model_deepseek.shapes`)."""
        spec = DeepseekSpec.from_config(config, cls.family)
        lm_head = None if spec.tie_word_embeddings else "lm_head.weight"
        return shapes.checkpoint_shapes(spec, "model.", lm_head, cls.correction_bias)

    def text_config(self) -> dict[str, Any]:
        """The config of the language model (the whole config for a causal LM checkpoint)."""
        return self.source.config

    def _prepare(self) -> DeepseekSpec:
        """Parse the config and set what every layer reads: ``spec``, the text stack's ``prefix``, the RoPE
        tables, Mistral 4's query scale table and this rank's query ``heads`` (the latent is whole)."""
        spec = self.spec = DeepseekSpec.from_config(
            self.text_config(), self.family, origin=f"{self.origin}/config.json"
        )
        self.prefix = self.find_prefix(list(TEXT_LAYOUTS), "embed_tokens.weight")
        self.rope_cos, self.rope_sin = self.rope_tables(spec.rope, spec.max_position_embeddings)
        table = spec.position_scale_table(self.table_length(spec.max_position_embeddings))
        self.position_scale = None if table is None else self.upload_float32(table)
        self.heads = self.shard.split(spec.mla.heads, "num_attention_heads")
        return spec

    def build(self) -> TransformerModel:
        spec = self._prepare()
        prefix = self.prefix
        layers = [self._decoder_layer(i, kv_index=i) for i in self.layer_progress(spec.num_layers)]
        embed, vocab_split = self.vocab_rows(prefix + "embed_tokens.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=self._norm(prefix + "norm.weight", spec),
            lm_head=embed if self.ties_embeddings(spec) else self.lm_head(TEXT_LAYOUTS[prefix]),
            kv_layouts=[self._kv_layout(spec)] * spec.num_layers,
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
            vocab_split=vocab_split,
        )

    def _decoder_layer(self, index: int, kv_index: int) -> DecoderLayer:
        """Checkpoint layer ``index`` (``{prefix}layers.{index}.``): MLA attention whose latent KV is cache
        layer ``kv_index``, then a dense MLP or MoE as ``index`` says (`DeepseekSpec.is_moe_layer`)."""
        spec, p = self.spec, f"{self.prefix}layers.{index}."
        attention = self.layer_type("mla")(
            self.backend,
            self._mla_weights(spec, p + "self_attn.", self.heads),
            layer_index=kv_index,
            shape=replace(spec.mla, heads=len(self.heads)),
            rope_cos=self.rope_cos,
            rope_sin=self.rope_sin,
            scale=spec.softmax_scale,
            position_scale=self.position_scale,
        )
        ffn = self._moe(spec, p + "mlp.") if spec.is_moe_layer(index) else self.gated_mlp(p + "mlp.")
        layer: DecoderLayer = self.layer_type("pre_norm_decoder_layer")(
            self._norm(p + "input_layernorm.weight", spec),
            self.reduced_mixer(attention),
            self._norm(p + "post_attention_layernorm.weight", spec),
            ffn,
        )
        return layer

    @staticmethod
    def _kv_layout(spec: DeepseekSpec) -> LatentKVLayout:
        return LatentKVLayout(spec.mla.latent_dim, spec.mla.rope_dim)

    @classmethod
    def mtp_checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build_mtp` reads (``num_nextn_predict_layers`` layers), for random weights."""
        spec = DeepseekSpec.from_config(config, cls.family)
        return shapes.mtp_shapes(spec, "model.", cls.correction_bias)

    def build_mtp(self, target: TransformerModel) -> MtpHead:
        """DeepSeek-V3's multi-token-prediction layers ``{prefix}layers.{num_hidden_layers + k}``
        (`atlas_core.model.mtp`): ``eh_proj`` over [``enorm``(embedding), ``hnorm``(h)], a full decoder
        layer (MoE by the layer rule), ``shared_head.norm`` then ``shared_head.head``, the un-normed
        output chained (``norm_in_logits``). The layer's ``embed_tokens`` and ``shared_head.head`` are
        used when stored and different from the target's; published checkpoints store copies of the
        target's, which are then shared rather than held twice."""
        spec = self._prepare()
        hidden_size = spec.hidden_size
        target_head = self.prefix + "embed_tokens.weight" if self.ties_embeddings(spec) else TEXT_LAYOUTS[self.prefix]
        layers: list[MtpLayer] = []
        for index in range(spec.num_layers, spec.num_layers + spec.num_mtp_layers):
            p = f"{self.prefix}layers.{index}."
            if p + "eh_proj.weight" not in self.source:
                break  # checkpoints converted or quantized without their MTP layers
            eh_proj = self.tensor(p + "eh_proj.weight")
            self.check_shape(p + "eh_proj.weight", eh_proj.shape, (hidden_size, 2 * hidden_size))
            layers.append(
                MtpLayer(
                    embed_norm=self._norm(p + "enorm.weight", spec),
                    hidden_norm=self._norm(p + "hnorm.weight", spec),
                    fc_embed=self.upload_arrays(np.ascontiguousarray(eh_proj[:, :hidden_size])),
                    fc_hidden=self.upload_arrays(np.ascontiguousarray(eh_proj[:, hidden_size:])),
                    layer=self._decoder_layer(index, kv_index=len(target.kv_layouts) + len(layers)),
                    final_norm=self._norm(p + "shared_head.norm.weight", spec),
                    norm_in_logits=True,
                    embed_tokens=self._own_table(p + "embed_tokens.weight", self.prefix + "embed_tokens.weight"),
                    lm_head=self._own_table(p + "shared_head.head.weight", target_head),
                )
            )
        if not layers:
            raise no_mtp_error(self.origin, self.family)
        return MtpHead(self.backend, target, layers, [self._kv_layout(spec)] * len(layers))

    def _own_table(self, name: str, target_name: str) -> Any:
        """An MTP layer's own vocabulary table ``name`` (embedding or LM head, this rank's rows), or None
        when the checkpoint has none or its values equal the target's ``target_name``."""
        if name not in self.source or same_values(self, name, target_name):
            return None
        return self.vocab_rows(name)[0]

    def ties_embeddings(self, spec: DeepseekSpec) -> bool:
        """Whether the LM head is the embedding table (no LM head tensor in the checkpoint)."""
        return spec.tie_word_embeddings

    # ---- pieces -------------------------------------------------------------------------------
    def _norm(self, name: str, spec: DeepseekSpec) -> Any:
        return self.rms_norm(name, spec.rms_norm_eps)

    def _mla_weights(self, spec: DeepseekSpec, a: str, heads: range) -> MLAWeights:
        """Query heads ``heads`` of the MLA layer under ``a`` (all of them unless tensor-parallel): their rows
        of the query projection and of ``kv_b_proj``, their columns of ``o_proj``; the latent path is whole."""
        shape = replace(spec.mla, heads=len(heads))
        q_rows = range(heads.start * (shape.nope_dim + shape.rope_dim), heads.stop * (shape.nope_dim + shape.rope_dim))
        q_name = a + ("q_proj.weight" if shape.q_lora_rank is None else "q_a_proj.weight")
        q_in = self.linear_weight(q_name) if shape.q_lora_rank is not None else self.weight_part(q_name, q_rows)
        kv_in = self.linear_weight(a + "kv_a_proj_with_mqa.weight")
        q_b = None if shape.q_lora_rank is None else self.weight_part(a + "q_b_proj.weight", q_rows)
        q_bias = kv_bias = None
        if spec.attention_bias:  # on q_a_proj and kv_a_proj_with_mqa (q_proj never has one) and o_proj
            kv_bias = self.tensor(a + "kv_a_proj_with_mqa.bias")
            q_bias = np.zeros(q_in.shape[0], kv_bias.dtype) if q_b is None else self.tensor(a + "q_a_proj.bias")
        if spec.rope_interleave:
            head = shape.nope_dim + shape.rope_dim
            if q_b is None:
                q_in = deinterleave_rope_rows(q_in, group=head, start=shape.nope_dim, rope_dim=shape.rope_dim)
            else:
                q_b = deinterleave_rope_rows(q_b, group=head, start=shape.nope_dim, rope_dim=shape.rope_dim)
            kv_width = shape.latent_dim + shape.rope_dim
            kv_in = deinterleave_rope_rows(kv_in, group=kv_width, start=shape.latent_dim, rope_dim=shape.rope_dim)
            if kv_bias is not None:
                kv_bias = deinterleave_rope_rows(
                    kv_bias, group=kv_width, start=shape.latent_dim, rope_dim=shape.rope_dim
                )
        expected_in = (shape.fused_q_width + shape.latent_dim + shape.rope_dim, spec.hidden_size)
        fused_in = concat_rows([q_in, kv_in])
        if tuple(fused_in.shape) != expected_in:
            raise ModelLoadError(
                f"{self.origin}: {q_name} {q_in.shape} and kv_a_proj_with_mqa {kv_in.shape} do not fit the config "
                f"(together {expected_in})"
            )
        head_rows = shape.nope_dim + shape.v_dim
        kv_b = self.float_part(a + "kv_b_proj.weight", range(heads.start * head_rows, heads.stop * head_rows))
        try:
            uk, uv = split_kv_b(kv_b, shape)
        except ValueError as exc:
            raise ModelLoadError(f"{self.origin}: {a}{exc}") from exc
        weight = self.upload_arrays
        return MLAWeights(
            fused_in=weight(fused_in),
            fused_in_bias=None if q_bias is None or kv_bias is None else weight(q_bias, kv_bias),
            kv_a_norm=self._norm(a + "kv_a_layernorm.weight", spec),
            q_b=None if q_b is None else weight(q_b),
            q_a_norm=None if q_b is None else self._norm(a + "q_a_layernorm.weight", spec),
            uk=weight(uk),
            uv=weight(uv),
            o=self.upload_arrays(
                self.weight_part(
                    a + "o_proj.weight", slice(None), range(heads.start * shape.v_dim, heads.stop * shape.v_dim)
                )
            ),
            o_bias=self.row_parallel_bias(spec.attention_bias, a + "o_proj.bias"),
        )

    def _moe(self, spec: DeepseekSpec, m: str) -> MoEFeedForward:
        return load_moe(
            self,
            m,
            spec.router,
            correction_bias=self.correction_bias,
            shared_expert=self.gated_mlp(m + "shared_experts.", reduce=False) if spec.num_shared_experts else None,
        )


class Mistral4Loader(DeepseekV3Loader):
    """Mistral Small 4's text stack: softmax router without correction bias, fused expert tensors,
    and Llama-4 style position-dependent query scaling."""

    family: ClassVar[Family] = "mistral4"
    correction_bias = None


class Mistral3Loader(Mistral4Loader):
    """A ``mistral3`` vision-language checkpoint: its language model, when that is Mistral 4 (the
    vision tower and projector are not loaded; text input only)."""

    def text_config(self) -> dict[str, Any]:
        return mistral4_text_config(self.source.config, f"{self.origin}/config.json")

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads from a checkpoint in the original (llava-style) layout."""
        spec = DeepseekSpec.from_config(mistral4_text_config(config), cls.family)
        lm_head = None if config.get("tie_word_embeddings", True) else "language_model.lm_head.weight"
        return shapes.checkpoint_shapes(spec, "language_model.model.", lm_head, cls.correction_bias)

    @classmethod
    def mtp_checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The multi-token-prediction layers of the text config's ``num_nextn_predict_layers`` (none in
        Mistral Small 4), in the original layout."""
        spec = DeepseekSpec.from_config(mistral4_text_config(config), cls.family)
        return shapes.mtp_shapes(spec, "language_model.model.", cls.correction_bias)

    def ties_embeddings(self, spec: DeepseekSpec) -> bool:
        """transformers ties a vision-language model's LM head by the top-level config key (default True)."""
        return bool(self.source.config.get("tie_word_embeddings", True))


COMPARE_CHUNK = 1 << 24
"""Elements of each tensor read at a time by `same_values`."""


def same_values(loader: ModelWeightLoader, name: str, other: str) -> bool:
    """Whether checkpoint tensors ``name`` and ``other`` have the same shape and values (False when
    ``other`` is missing), read a block of rows at a time so that host memory stays small."""
    if other not in loader.source:
        return False
    shape = loader.weight_shape(name)
    if loader.weight_shape(other) != shape or not shape:
        return False
    rows = max(1, COMPARE_CHUNK // max(1, math.prod(shape[1:])))
    return all(
        np.array_equal(loader.float_part(name, part), loader.float_part(other, part))
        for part in (range(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows))
    )


def mistral4_text_config(config: dict[str, Any], origin: str = "config.json") -> dict[str, Any]:
    """The ``text_config`` of a ``mistral3`` config; `UnsupportedArchitectureError` when it is not Mistral 4's."""
    text: dict[str, Any] = config.get("text_config") or {}
    if text.get("model_type") != "mistral4":
        raise UnsupportedArchitectureError(
            f"{origin}: a mistral3 checkpoint whose text_config.model_type is {text.get('model_type')!r}; "
            "atlas-model-deepseek loads only Mistral 4 text stacks (model_type 'mistral4')"
        )
    return text
