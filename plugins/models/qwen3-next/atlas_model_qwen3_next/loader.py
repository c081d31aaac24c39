"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE checkpoints -> a hybrid `TransformerModel`.

Each layer: zero-centred RMSNorm (scale ``1 + w``) -> gated delta net or gated attention -> RMSNorm ->
dense SwiGLU MLP or sparse MoE with a sigmoid-gated shared expert. The text stack sits under
``model.`` or, in Qwen3.5's vision-language checkpoints, ``model.language_model.`` (the vision tower
``model.visual.*`` is not loaded). The multi-token-prediction layers (``mtp.*``) are read only for
speculative decoding with method ``mtp`` (`Qwen3NextLoader.build_mtp`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atlas_core.batch.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.gated_delta_net import GatedDeltaNetWeights
from atlas_core.model.layers.moe import MoEFeedForward, RouterSpec, load_moe
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.mtp import MtpHead, MtpLayer, no_mtp_error
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.transformer import FeedForward, Mixer, TransformerModel
from atlas_model_qwen3_next import shapes
from atlas_model_qwen3_next.config import LINEAR_ATTENTION, HybridSpec
from atlas_model_qwen3_next.projections import gdn_in_proj_from_fused, split_gated_query

TEXT_PREFIXES = ("model.language_model.", "model.")
"""Where the text stack's weights may sit: vision-language checkpoints first."""
MTP_PREFIX = "mtp."


class Qwen3NextLoader(ModelWeightLoader):
    """Loads every ``model_type`` of the family (see ``plugin.py``)."""

    supports_expert_parallel = True  # its MoE blocks come from load_moe; the rest is whole on every rank

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads (`atlas_model_qwen3_next.shapes`)."""
        return shapes.checkpoint_shapes(config)

    def _prepare(self) -> HybridSpec:
        spec = self.spec = HybridSpec.from_config(self.source.config, f"{self.origin}/config.json")
        self.prefix = self.find_prefix(TEXT_PREFIXES, "embed_tokens.weight")
        self.rope_cos, self.rope_sin = self.rope_tables(spec.decoder.rope, spec.decoder.max_position_embeddings)
        return spec

    def build(self) -> TransformerModel:
        spec = self._prepare()
        decoder = spec.decoder
        state = RecurrentState()
        kv_layouts: list[KVLayout] = []
        layers = []
        for i in self.layer_progress(len(spec.layer_types)):
            p = f"{self.prefix}layers.{i}."
            if spec.layer_types[i] == LINEAR_ATTENTION:
                weights = self._gdn_weights(p + "linear_attn.", spec)
                mixer: Mixer = self.layer_type("gated_delta_net")(
                    self.backend, weights, spec.gdn, layer_index=i, state=state
                )
            else:
                mixer = self._attention(p + "self_attn.", spec, kv_index=len(kv_layouts))
                kv_layouts.append(
                    KVLayout(decoder.num_kv_heads, decoder.head_dim, None, *self.kv_scales(p + "self_attn."))
                )
            ffn = self._moe(p + "mlp.", spec) if i in spec.moe_layers else self.gated_mlp(p + "mlp.")
            layers.append(
                self.layer_type("pre_norm_decoder_layer")(
                    self._norm(p + "input_layernorm.weight"),
                    mixer,
                    self._norm(p + "post_attention_layernorm.weight"),
                    ffn,
                )
            )
        embed = self.upload(self.prefix + "embed_tokens.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=self._norm(self.prefix + "norm.weight"),
            lm_head=embed if decoder.tie_word_embeddings else self.upload("lm_head.weight"),
            kv_layouts=kv_layouts,
            vocab_size=decoder.vocab_size,
            max_position_embeddings=decoder.max_position_embeddings,
            recurrent_state=state,
        )

    def build_mtp(self, target: TransformerModel) -> MtpHead:
        """The ``mtp.*`` layers (`atlas_core.model.mtp`): ``fc`` over [embedding, hidden] after their
        zero-centred norms, ``layers.i`` a gated-attention decoder layer (MoE when it has a router, as
        the checkpoint has it), ``norm``; the target's embedding and LM head are shared."""
        spec = self._prepare()
        decoder, hidden_size = spec.decoder, spec.decoder.hidden_size
        layers: list[MtpLayer] = []
        kv_layouts: list[KVLayout] = []
        while f"{MTP_PREFIX}layers.{len(layers)}.input_layernorm.weight" in self.source:
            p = f"{MTP_PREFIX}layers.{len(layers)}."
            # the MTP layers' KV follows the target's layers in the engine's cache
            mixer = self._attention(p + "self_attn.", spec, kv_index=len(target.kv_layouts) + len(kv_layouts))
            kv_layouts.append(KVLayout(decoder.num_kv_heads, decoder.head_dim, None, *self.kv_scales(p + "self_attn.")))
            ffn: FeedForward = (
                self._moe(p + "mlp.", spec) if p + "mlp.gate.weight" in self.source else self.gated_mlp(p + "mlp.")
            )
            fc = self.tensor(MTP_PREFIX + "fc.weight")
            self.check_shape(MTP_PREFIX + "fc.weight", fc.shape, (hidden_size, 2 * hidden_size))
            layer = self.layer_type("pre_norm_decoder_layer")(
                self._norm(p + "input_layernorm.weight"), mixer, self._norm(p + "post_attention_layernorm.weight"), ffn
            )
            layers.append(
                MtpLayer(
                    embed_norm=self._norm(MTP_PREFIX + "pre_fc_norm_embedding.weight"),
                    hidden_norm=self._norm(MTP_PREFIX + "pre_fc_norm_hidden.weight"),
                    fc_embed=self.upload_arrays(np.ascontiguousarray(fc[:, :hidden_size])),
                    fc_hidden=self.upload_arrays(np.ascontiguousarray(fc[:, hidden_size:])),
                    layer=layer,
                    final_norm=self._norm(MTP_PREFIX + "norm.weight"),
                )
            )
        if not layers:
            raise no_mtp_error(self.origin, str(self.source.config.get("model_type")))
        return MtpHead(self.backend, target, layers, kv_layouts)

    def _norm(self, name: str) -> Any:
        """The family's zero-centred RMSNorm: the checkpoint stores ``w``, the norm scales by ``1 + w``."""
        return self.rms_norm(name, self.spec.decoder.rms_norm_eps, zero_centred=True)

    def _moe(self, prefix: str, spec: HybridSpec) -> MoEFeedForward:
        moe = spec.moe
        assert moe is not None  # moe_layers is empty without a MoESpec
        return load_moe(
            self,
            prefix,
            RouterSpec(moe.num_experts, moe.top_k, "softmax", normalize_top_k=moe.normalize_top_k),
            shared_expert=self.gated_mlp(prefix + "shared_expert."),
            shared_expert_gate="shared_expert_gate.weight",
        )

    def _attention(self, prefix: str, spec: HybridSpec, kv_index: int) -> Any:
        decoder = spec.decoder
        q, gate = self._checked(split_gated_query, prefix + "q_proj.weight", decoder.num_heads, decoder.head_dim)
        rows = [q, self.tensor(prefix + "k_proj.weight"), self.tensor(prefix + "v_proj.weight"), gate]
        qkv_bias = None
        if decoder.qkv_bias:
            heads, dim = decoder.num_heads, decoder.head_dim
            q_bias, gate_bias = self._checked(split_gated_query, prefix + "q_proj.bias", heads, dim)
            k_bias, v_bias = self.tensor(prefix + "k_proj.bias"), self.tensor(prefix + "v_proj.bias")
            qkv_bias = self.upload_arrays(q_bias, k_bias, v_bias, gate_bias)
        weights = AttentionWeights(
            qkv=self.upload_arrays(*rows),
            o=self.upload(prefix + "o_proj.weight"),
            qkv_bias=qkv_bias,
            o_bias=self.optional_upload(decoder.o_bias, prefix + "o_proj.bias"),
            q_norm=self._norm(prefix + "q_norm.weight"),
            k_norm=self._norm(prefix + "k_norm.weight"),
        )
        return self.layer_type("gated_attention")(
            self.backend,
            weights,
            layer_index=kv_index,
            num_heads=decoder.num_heads,
            num_kv_heads=decoder.num_kv_heads,
            head_dim=decoder.head_dim,
            rope_cos=self.rope_cos,
            rope_sin=self.rope_sin,
        )

    def _gdn_weights(self, prefix: str, spec: HybridSpec) -> GatedDeltaNetWeights:
        shape = spec.gdn
        if prefix + "in_proj_qkvz.weight" in self.source:  # Qwen3-Next: fused, grouped by key head
            ba = self.tensor(prefix + "in_proj_ba.weight")
            in_proj = self._checked(gdn_in_proj_from_fused, prefix + "in_proj_qkvz.weight", ba, shape)
        else:  # Qwen3.5: one projection each
            in_proj = np.concatenate(
                [self.tensor(prefix + f"in_proj_{part}.weight") for part in ("qkv", "z", "b", "a")]
            )
        conv = self.tensor(prefix + "conv1d.weight")
        self.check_shape(
            f"{prefix.rstrip('.')} input projections", in_proj.shape, (shape.projection_rows, spec.decoder.hidden_size)
        )
        self.check_shape(prefix + "conv1d.weight", conv.shape, (shape.conv_dim, 1, shape.conv_kernel))
        return GatedDeltaNetWeights(
            in_proj=self.upload_arrays(in_proj),
            conv=self.upload_arrays(conv.reshape(conv.shape[0], -1)),
            a_log=self.upload_float32(self.tensor(prefix + "A_log")),
            dt_bias=self.upload_float32(self.tensor(prefix + "dt_bias")),
            norm=self.upload(prefix + "norm.weight"),
            out_proj=self.upload(prefix + "out_proj.weight"),
        )

    def _checked(self, rearrange: Callable[..., Any], name: str, *args: Any) -> Any:
        """``rearrange(tensor(name), *args)``, its `ValueError` turned into a `ModelLoadError` naming the tensor."""
        try:
            return rearrange(self.tensor(name), *args)
        except ValueError as exc:
            raise ModelLoadError(f"{self.origin}: {name}: {exc}") from exc
