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

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from atlas_core.batch.kv_cache import LatentKVLayout
from atlas_core.errors import ModelLoadError, UnsupportedArchitectureError
from atlas_core.model.layers.mla import MLAWeights, deinterleave_rope_rows, split_kv_b
from atlas_core.model.layers.moe import MoEFeedForward, load_moe
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.transformer import TransformerModel
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
    ``e_score_correction_bias``. Multi-token-prediction layers past ``num_hidden_layers`` are ignored."""

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

    def build(self) -> TransformerModel:
        spec = DeepseekSpec.from_config(self.text_config(), self.family, origin=f"{self.origin}/config.json")
        prefix = self.find_prefix(list(TEXT_LAYOUTS), "embed_tokens.weight")
        lm_head_name = TEXT_LAYOUTS[prefix]
        backend = self.backend
        cos, sin = self.rope_tables(spec.rope, spec.max_position_embeddings)
        table = spec.position_scale_table(self.table_length(spec.max_position_embeddings))
        position_scale = None if table is None else self.upload_float32(table)

        attention_type, layer_type = self.layer_type("mla"), self.layer_type("pre_norm_decoder_layer")
        heads = self.shard.split(spec.mla.heads, "num_attention_heads")  # a rank's query heads (the latent is whole)
        layers = []
        for i in self.layer_progress(spec.num_layers):
            p = f"{prefix}layers.{i}."
            attention = attention_type(
                backend,
                self._mla_weights(spec, p + "self_attn.", heads),
                layer_index=i,
                shape=replace(spec.mla, heads=len(heads)),
                rope_cos=cos,
                rope_sin=sin,
                scale=spec.softmax_scale,
                position_scale=position_scale,
            )
            ffn = self._moe(spec, p + "mlp.") if spec.is_moe_layer(i) else self.gated_mlp(p + "mlp.")
            layers.append(
                layer_type(
                    self._norm(p + "input_layernorm.weight", spec),
                    self.reduced_mixer(attention),
                    self._norm(p + "post_attention_layernorm.weight", spec),
                    ffn,
                )
            )
        embed, vocab_split = self.vocab_rows(prefix + "embed_tokens.weight")
        return TransformerModel(
            backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=self._norm(prefix + "norm.weight", spec),
            lm_head=embed if self.ties_embeddings(spec) else self.lm_head(lm_head_name),
            kv_layouts=[LatentKVLayout(spec.mla.latent_dim, spec.mla.rope_dim)] * spec.num_layers,
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
            vocab_split=vocab_split,
        )

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

    def ties_embeddings(self, spec: DeepseekSpec) -> bool:
        """transformers ties a vision-language model's LM head by the top-level config key (default True)."""
        return bool(self.source.config.get("tie_word_embeddings", True))


def mistral4_text_config(config: dict[str, Any], origin: str = "config.json") -> dict[str, Any]:
    """The ``text_config`` of a ``mistral3`` config; `UnsupportedArchitectureError` when it is not Mistral 4's."""
    text: dict[str, Any] = config.get("text_config") or {}
    if text.get("model_type") != "mistral4":
        raise UnsupportedArchitectureError(
            f"{origin}: a mistral3 checkpoint whose text_config.model_type is {text.get('model_type')!r}; "
            "atlas-model-deepseek loads only Mistral 4 text stacks (model_type 'mistral4')"
        )
    return text
