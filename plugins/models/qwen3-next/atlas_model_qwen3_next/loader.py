"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE checkpoints -> a hybrid `TransformerModel`.

Each layer: zero-centred RMSNorm (scale ``1 + w``) -> gated delta net or gated attention -> RMSNorm ->
dense SwiGLU MLP or sparse MoE with a sigmoid-gated shared expert. The text stack sits under
``model.`` or, in Qwen3.5's vision-language checkpoints, ``model.language_model.``; their vision tower
(``model.visual.*``, Qwen3-VL's ViT without deepstack) is attached as the model's vision side by
``atlas-model-qwen3-vl`` (`atlas_model_qwen3_vl.attach`; on rank 0 alone when the model is split over
ranks), images rotated by interleaved M-RoPE. The
multi-token-prediction layers (``mtp.*``) are read only for speculative decoding with method ``mtp``
(`Qwen3NextLoader.build_mtp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from atlas_model_qwen3_vl.attach import TOWER_PROBE, attach_vision

from atlas_core.batch.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.gated_delta_net import GatedDeltaNetShape, GatedDeltaNetWeights
from atlas_core.model.layers.moe import MoEFeedForward, RouterSpec, load_moe
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.mtp import MtpHead, MtpLayer, no_mtp_error
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.transformer import FeedForward, Mixer, TransformerModel
from atlas_model_qwen3_next import shapes
from atlas_model_qwen3_next.config import LINEAR_ATTENTION, HybridSpec
from atlas_model_qwen3_next.projections import (
    check_fused_gdn_rows,
    check_gated_query_rows,
    gdn_in_proj_from_fused,
    split_gated_query,
)

TEXT_PREFIXES = ("model.language_model.", "model.")
"""Where the text stack's weights may sit: vision-language checkpoints first."""
MTP_PREFIX = "mtp."


class Qwen3NextLoader(ModelWeightLoader):
    """Loads every ``model_type`` of the family (see ``plugin.py``). Split by tensor parallelism, a rank
    keeps its gated-attention query heads (key/value heads as `ShardPlan.kv_heads` says), its GDN key heads
    with their value heads, and its rows of every MLP and shared expert."""

    supports_tensor_parallel = True
    supports_expert_parallel = True

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
        key_heads = self.shard.split(spec.gdn.num_key_heads, "linear_num_key_heads")
        gdn_shape = local_gdn_shape(spec.gdn, key_heads)
        kv_heads = self.shard.kv_heads(decoder.num_kv_heads, decoder.num_heads)
        for i in self.layer_progress(len(spec.layer_types)):
            p = f"{self.prefix}layers.{i}."
            if spec.layer_types[i] == LINEAR_ATTENTION:
                weights = self._gdn_weights(p + "linear_attn.", spec, key_heads)
                mixer: Mixer = self.layer_type("gated_delta_net")(
                    self.backend, weights, gdn_shape, layer_index=i, state=state
                )
            else:
                mixer = self._attention(p + "self_attn.", spec, kv_index=len(kv_layouts))
                kv_layouts.append(KVLayout(len(kv_heads), decoder.head_dim, None, *self.kv_scales(p + "self_attn.")))
            mixer = self.reduced_mixer(mixer)
            ffn = self._moe(p + "mlp.", spec) if i in spec.moe_layers else self.gated_mlp(p + "mlp.")
            layers.append(
                self.layer_type("pre_norm_decoder_layer")(
                    self._norm(p + "input_layernorm.weight"),
                    mixer,
                    self._norm(p + "post_attention_layernorm.weight"),
                    ffn,
                )
            )
        embed, vocab_split = self.vocab_rows(self.prefix + "embed_tokens.weight")
        model = TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=self._norm(self.prefix + "norm.weight"),
            lm_head=embed if decoder.tie_word_embeddings else self.lm_head("lm_head.weight"),
            kv_layouts=kv_layouts,
            vocab_size=decoder.vocab_size,
            max_position_embeddings=decoder.max_position_embeddings,
            recurrent_state=state,
            vocab_split=vocab_split,
        )
        if TOWER_PROBE in self.source and self.loads_vision_tower:  # split: rank 0 alone encodes images
            model.vision = attach_vision(self, decoder.rope)
        return model

    @classmethod
    def mtp_checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build_mtp` reads (one MTP layer), for random weights."""
        return shapes.mtp_shapes(HybridSpec.from_config(config, "config.json"))

    def build_mtp(self, target: TransformerModel) -> MtpHead:
        """The ``mtp.*`` layers (`atlas_core.model.mtp`): ``fc`` over [embedding, hidden] after their
        zero-centred norms, ``layers.i`` a gated-attention decoder layer (MoE when it has a router, as
        the checkpoint has it), ``norm``; the target's embedding and LM head are shared."""
        spec = self._prepare()
        decoder, hidden_size = spec.decoder, spec.decoder.hidden_size
        layers: list[MtpLayer] = []
        kv_layouts: list[KVLayout] = []
        kv_heads = len(self.shard.kv_heads(decoder.num_kv_heads, decoder.num_heads))  # split like the target's
        while f"{MTP_PREFIX}layers.{len(layers)}.input_layernorm.weight" in self.source:
            p = f"{MTP_PREFIX}layers.{len(layers)}."
            # the MTP layers' KV follows the target's layers in the engine's cache
            mixer = self._attention(p + "self_attn.", spec, kv_index=len(target.kv_layouts) + len(kv_layouts))
            mixer = self.reduced_mixer(mixer)
            kv_layouts.append(KVLayout(kv_heads, decoder.head_dim, None, *self.kv_scales(p + "self_attn.")))
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
            shared_expert=self.gated_mlp(prefix + "shared_expert.", reduce=False),
            shared_expert_gate="shared_expert_gate.weight",
        )

    def _attention(self, prefix: str, spec: HybridSpec, kv_index: int) -> Any:
        decoder, dim = spec.decoder, spec.decoder.head_dim
        heads = self.shard.split(decoder.num_heads, "num_attention_heads")
        q_rows, kv_rows = span(heads, 2 * dim), span(self.shard.kv_heads(decoder.num_kv_heads, decoder.num_heads), dim)

        def query(kind: str) -> tuple[np.ndarray, np.ndarray]:
            name = prefix + f"q_proj.{kind}"
            self._checked(lambda shape: check_gated_query_rows(shape[0], decoder.num_heads, dim), name, shape_only=True)
            return self._checked(split_gated_query, name, len(heads), dim, rows=q_rows)

        q, gate = query("weight")
        rows = [
            q,
            self.float_part(prefix + "k_proj.weight", kv_rows),
            self.float_part(prefix + "v_proj.weight", kv_rows),
        ]
        qkv_bias = None
        if decoder.qkv_bias:
            q_bias, gate_bias = query("bias")
            k_bias, v_bias = (self.float_part(prefix + f"{p}_proj.bias", kv_rows) for p in "kv")
            qkv_bias = self.upload_arrays(q_bias, k_bias, v_bias, gate_bias)
        weights = AttentionWeights(
            qkv=self.upload_arrays(*rows, gate),
            o=self.upload_arrays(self.weight_part(prefix + "o_proj.weight", slice(None), span(heads, dim))),
            qkv_bias=qkv_bias,
            o_bias=self.row_parallel_bias(decoder.o_bias, prefix + "o_proj.bias"),
            q_norm=self._norm(prefix + "q_norm.weight"),
            k_norm=self._norm(prefix + "k_norm.weight"),
        )
        return self.layer_type("gated_attention")(
            self.backend,
            weights,
            layer_index=kv_index,
            num_heads=len(heads),
            num_kv_heads=len(kv_rows) // dim,
            head_dim=decoder.head_dim,
            rope_cos=self.rope_cos,
            rope_sin=self.rope_sin,
        )

    def _gdn_weights(self, prefix: str, spec: HybridSpec, key_heads: range) -> GatedDeltaNetWeights:
        """The GDN layer's weights for key heads ``key_heads`` and their value heads (all of them unsplit)."""
        whole, shape = spec.gdn, local_gdn_shape(spec.gdn, key_heads)
        ratio = whole.num_value_heads // whole.num_key_heads
        value_heads = range(key_heads.start * ratio, key_heads.stop * ratio)
        dk, dv = whole.key_head_dim, whole.value_head_dim
        channels = [span(key_heads, dk), span(key_heads, dk, whole.key_dim), span(value_heads, dv, 2 * whole.key_dim)]
        if prefix + "in_proj_qkvz.weight" in self.source:  # Qwen3-Next: fused, grouped by key head
            ba_shape = self.weight_shape(prefix + "in_proj_ba.weight")
            self._checked(check_fused_gdn_rows, prefix + "in_proj_qkvz.weight", ba_shape, whole, shape_only=True)
            ba = self.float_part(prefix + "in_proj_ba.weight", span(key_heads, 2 * ratio))
            group = 2 * dk + 2 * ratio * dv
            in_proj = self._checked(
                gdn_in_proj_from_fused, prefix + "in_proj_qkvz.weight", ba, shape, rows=span(key_heads, group)
            )
        else:  # Qwen3.5: one projection each
            rows = sum(self.weight_shape(prefix + f"in_proj_{part}.weight")[0] for part in ("qkv", "z", "b", "a"))
            hidden = self.weight_shape(prefix + "in_proj_qkv.weight")[1:]
            self.check_shape(
                f"{prefix.rstrip('.')} input projections",
                (rows, *hidden),
                (whole.projection_rows, spec.decoder.hidden_size),
            )
            qkv = [self.float_part(prefix + "in_proj_qkv.weight", rows) for rows in channels]
            rest = [
                self.float_part(prefix + f"in_proj_{part}.weight", rows)
                for part, rows in (("z", span(value_heads, dv)), ("b", value_heads), ("a", value_heads))
            ]
            in_proj = np.concatenate([*qkv, *rest])
        conv_shape = self.weight_shape(prefix + "conv1d.weight")
        self.check_shape(prefix + "conv1d.weight", conv_shape, (whole.conv_dim, 1, whole.conv_kernel))
        conv = np.concatenate([self.float_part(prefix + "conv1d.weight", rows) for rows in channels])
        self.check_shape(
            f"{prefix.rstrip('.')} input projections", in_proj.shape, (shape.projection_rows, spec.decoder.hidden_size)
        )
        self.check_shape(prefix + "conv1d.weight", conv.shape, (shape.conv_dim, 1, shape.conv_kernel))
        return GatedDeltaNetWeights(
            in_proj=self.upload_arrays(in_proj),
            conv=self.upload_arrays(conv.reshape(conv.shape[0], -1)),
            a_log=self.upload_float32(self.float_part(prefix + "A_log", value_heads)),
            dt_bias=self.upload_float32(self.float_part(prefix + "dt_bias", value_heads)),
            norm=self.upload(prefix + "norm.weight"),
            out_proj=self.upload_arrays(
                self.weight_part(prefix + "out_proj.weight", slice(None), span(value_heads, dv))
            ),
        )

    def _checked(
        self, rearrange: Callable[..., Any], name: str, *args: Any, rows: range | None = None, shape_only: bool = False
    ) -> Any:
        """``rearrange(tensor(name), *args)`` (only ``rows`` of the tensor when given; with ``shape_only`` its
        shape: `weight_shape`), its `ValueError` turned into a `ModelLoadError` naming the tensor."""
        try:
            if shape_only:
                return rearrange(self.weight_shape(name), *args)
            return rearrange(self.tensor(name) if rows is None else self.float_part(name, rows), *args)
        except ValueError as exc:
            raise ModelLoadError(f"{self.origin}: {name}: {exc}") from exc


def span(heads: range, width: int, offset: int = 0) -> range:
    """The rows of ``heads``, each ``width`` rows wide, in a tensor whose head 0 starts at row ``offset``."""
    return range(offset + heads.start * width, offset + heads.stop * width)


def local_gdn_shape(shape: GatedDeltaNetShape, key_heads: range) -> GatedDeltaNetShape:
    """``shape`` cut to key heads ``key_heads`` and their value heads."""
    ratio = shape.num_value_heads // shape.num_key_heads
    return replace(shape, num_key_heads=len(key_heads), num_value_heads=len(key_heads) * ratio)
