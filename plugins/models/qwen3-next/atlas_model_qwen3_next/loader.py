"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE checkpoints -> a hybrid `TransformerModel`.

Each layer: zero-centred RMSNorm (scale ``1 + w``) -> gated delta net or gated attention -> RMSNorm ->
dense SwiGLU MLP or sparse MoE with a sigmoid-gated shared expert. The text stack sits under
``model.`` or, in Qwen3.5's vision-language checkpoints, ``model.language_model.`` (the vision tower
``model.visual.*`` is not loaded). Multi-token-prediction weights (``mtp.*``) are never read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from atlas_core.backends.base import Array
from atlas_core.engine.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.gated_attention import GatedAttention
from atlas_core.model.layers.gated_delta_net import GatedDeltaNet, GatedDeltaNetWeights
from atlas_core.model.layers.moe import MoEFeedForward, RoutedExperts, RouterSpec, read_experts
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.transformer import PreNormDecoderLayer, TransformerModel
from atlas_model_qwen3_next.config import LINEAR_ATTENTION, HybridSpec
from atlas_model_qwen3_next.projections import gdn_in_proj_from_fused, split_gated_query

TEXT_PREFIXES = ("model.language_model.", "model.")
"""Where the text stack's weights may sit: vision-language checkpoints first."""


class Qwen3NextLoader(ModelWeightLoader):
    """Loads every ``model_type`` of the family (see ``plugin.py``)."""

    def build(self) -> TransformerModel:
        spec = self.spec = HybridSpec.from_config(self.source.config, f"{self.origin}/config.json")
        self.prefix = self._text_prefix()
        decoder = spec.decoder
        self.rope_cos, self.rope_sin = self.rope_tables(decoder.rope, decoder.max_position_embeddings)
        state = RecurrentState()
        kv_layouts: list[KVLayout] = []
        layers = []
        num_layers = len(spec.layer_types)
        for i, kind in tqdm(enumerate(spec.layer_types), total=num_layers, desc="loading layers", unit="layer",
                            disable=num_layers < 16, leave=False):
            p = f"{self.prefix}layers.{i}."
            if kind == LINEAR_ATTENTION:
                weights = self._gdn_weights(p + "linear_attn.", spec)
                mixer: Any = GatedDeltaNet(self.backend, weights, spec.gdn, layer_index=i, state=state)
            else:
                mixer = self._attention(p + "self_attn.", spec, kv_index=len(kv_layouts))
                kv_layouts.append(KVLayout(decoder.num_kv_heads, decoder.head_dim))
            ffn = self._moe(p + "mlp.", spec) if i in spec.moe_layers else self._mlp(p + "mlp.")
            layers.append(
                PreNormDecoderLayer(self._norm(p + "input_layernorm.weight"), mixer,
                                    self._norm(p + "post_attention_layernorm.weight"), ffn)
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

    def _text_prefix(self) -> str:
        for prefix in TEXT_PREFIXES:
            if prefix + "embed_tokens.weight" in self.source:
                return prefix
        tried = " or ".join(repr(p + "embed_tokens.weight") for p in TEXT_PREFIXES)
        raise ModelLoadError(f"{self.origin}: the checkpoint has no {tried}; is this a Qwen3-Next / Qwen3.5 checkpoint?")

    def _norm(self, name: str) -> Any:
        """A zero-centred RMSNorm: the checkpoint stores ``w``, the norm scales by ``1 + w``."""
        weight = self.backend.from_numpy(1.0 + self.tensor(name).astype(np.float32), weight=True)
        return self.layer_type("rms_norm")(self.backend, weight, self.spec.decoder.rms_norm_eps)

    def _mlp(self, prefix: str) -> Any:
        return self.layer_type("swiglu_mlp")(
            self.backend, self.upload(prefix + "gate_proj.weight", prefix + "up_proj.weight"),
            self.upload(prefix + "down_proj.weight"),
        )

    def _moe(self, prefix: str, spec: HybridSpec) -> MoEFeedForward:
        moe = spec.moe
        assert moe is not None  # moe_layers is empty without a MoESpec
        w_in, w_out = read_experts(self, prefix + "experts.", moe.num_experts)
        return MoEFeedForward(
            self.backend,
            self.upload(prefix + "gate.weight"),
            RoutedExperts.upload(self.backend, w_in, w_out, "silu"),
            RouterSpec(moe.num_experts, moe.top_k, "softmax", normalize_top_k=moe.normalize_top_k),
            shared_expert=self._mlp(prefix + "shared_expert."),
            shared_expert_gate=self.upload(prefix + "shared_expert_gate.weight"),
        )

    def _attention(self, prefix: str, spec: HybridSpec, kv_index: int) -> GatedAttention:
        decoder = spec.decoder
        q, gate = self._checked(split_gated_query, prefix + "q_proj.weight", decoder.num_heads, decoder.head_dim)
        rows = [q, self.tensor(prefix + "k_proj.weight"), self.tensor(prefix + "v_proj.weight"), gate]
        qkv_bias = None
        if decoder.qkv_bias:
            heads, dim = decoder.num_heads, decoder.head_dim
            q_bias, gate_bias = self._checked(split_gated_query, prefix + "q_proj.bias", heads, dim)
            k_bias, v_bias = self.tensor(prefix + "k_proj.bias"), self.tensor(prefix + "v_proj.bias")
            qkv_bias = self._weight(q_bias, k_bias, v_bias, gate_bias)
        weights = AttentionWeights(
            qkv=self._weight(*rows),
            o=self.upload(prefix + "o_proj.weight"),
            qkv_bias=qkv_bias,
            o_bias=self.upload(prefix + "o_proj.bias") if decoder.o_bias else None,
            q_norm=self._norm(prefix + "q_norm.weight"),
            k_norm=self._norm(prefix + "k_norm.weight"),
        )
        return GatedAttention(
            self.backend, weights, layer_index=kv_index, num_heads=decoder.num_heads,
            num_kv_heads=decoder.num_kv_heads, head_dim=decoder.head_dim, rope_cos=self.rope_cos, rope_sin=self.rope_sin,
        )

    def _gdn_weights(self, prefix: str, spec: HybridSpec) -> GatedDeltaNetWeights:
        shape = spec.gdn
        if prefix + "in_proj_qkvz.weight" in self.source:  # Qwen3-Next: fused, grouped by key head
            ba = self.tensor(prefix + "in_proj_ba.weight")
            in_proj = self._checked(gdn_in_proj_from_fused, prefix + "in_proj_qkvz.weight", ba, shape)
        else:  # Qwen3.5: one projection each
            in_proj = np.concatenate([self.tensor(prefix + f"in_proj_{part}.weight") for part in ("qkv", "z", "b", "a")])
        conv = self.tensor(prefix + "conv1d.weight")
        expected = {"input projections": (shape.projection_rows, spec.decoder.hidden_size),
                    "conv1d.weight": (shape.conv_dim, 1, shape.conv_kernel)}
        for what, got in (("input projections", in_proj.shape), ("conv1d.weight", conv.shape)):
            if tuple(got) != expected[what]:
                raise ModelLoadError(
                    f"{self.origin}: {prefix.rstrip('.')} {what}: shape {tuple(got)}, "
                    f"but config.json implies {expected[what]}"
                )
        f32 = np.dtype(np.float32)
        return GatedDeltaNetWeights(
            in_proj=self._weight(in_proj),
            conv=self._weight(conv.reshape(conv.shape[0], -1)),
            a_log=self.backend.from_numpy(self.tensor(prefix + "A_log"), dtype=f32),
            dt_bias=self.backend.from_numpy(self.tensor(prefix + "dt_bias"), dtype=f32),
            norm=self.upload(prefix + "norm.weight"),
            out_proj=self.upload(prefix + "out_proj.weight"),
        )

    def _checked(self, rearrange: Callable[..., Any], name: str, *args: Any) -> Any:
        """``rearrange(tensor(name), *args)``, its `ValueError` turned into a `ModelLoadError` naming the tensor."""
        try:
            return rearrange(self.tensor(name), *args)
        except ValueError as exc:
            raise ModelLoadError(f"{self.origin}: {name}: {exc}") from exc

    def _weight(self, *arrays: np.ndarray) -> Array:
        """Host arrays concatenated along the output axis, uploaded as one weight."""
        return self.backend.from_numpy(arrays[0] if len(arrays) == 1 else np.concatenate(arrays), weight=True)
