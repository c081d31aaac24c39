"""Gemma 3 / Gemma 4 checkpoints -> `GemmaModel` / `Gemma4Model`.

Weight names are Hugging Face's under the text stack's prefix: ``model.`` for the text-only
classes, ``model.language_model.`` for vision-language checkpoints (``language_model.model.`` in
ones saved before transformers 4.52). Vision and audio towers are not read.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.engine.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights, SharedKVAttention
from atlas_core.model.layers.geglu import GeGLUMLP
from atlas_core.model.layers.moe import MoEFeedForward, RoutedExperts, read_experts
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.layers.per_layer_inputs import PerLayerInputGate, PerLayerInputs
from atlas_core.model.layers.sandwich import SandwichDecoderLayer
from atlas_core.model.loader import ModelWeightLoader
from atlas_model_gemma.config import FULL, Family, GemmaLayerSpec, GemmaSpec, parse
from atlas_model_gemma.layers import Gemma4DecoderLayer, ParallelMoEDecoderLayer
from atlas_model_gemma.model import Gemma4Model, GemmaModel

TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")


class GemmaLoader(ModelWeightLoader):
    """The parts Gemma 3 and Gemma 4 share; subclasses set `family` and build their layers."""

    family: ClassVar[Family]

    def build(self) -> GemmaModel:
        self.spec: GemmaSpec = parse(self.source.config, self.family, f"{self.origin}/config.json")
        self.prefix = self._text_prefix()
        self._rope_cache: dict[tuple[str, int], tuple[Array, Array]] = {}
        # one KV cache slot per layer that computes its own keys and values; KV-shared layers read their source's
        self.cache_slots: dict[int, int] = {}
        for i, layer in enumerate(self.spec.layers):
            if layer.kv_source == i:
                self.cache_slots[i] = len(self.cache_slots)
        embed = self.upload(self.prefix + "embed_tokens.weight")
        owners = [self.spec.layers[i] for i in self.cache_slots]
        return self.model_class()(
            self.backend,
            embed_tokens=embed,
            layers=[self.decoder_layer(i, layer) for i, layer in enumerate(self.spec.layers)],
            final_norm=self.norm(self.prefix + "norm.weight"),
            lm_head=embed if self.spec.tie_word_embeddings else self.upload(self._lm_head_name()),
            kv_layouts=[KVLayout(layer.num_kv_heads, layer.head_dim) for layer in owners],
            vocab_size=int(self.spec["vocab_size"]),
            max_position_embeddings=int(self.spec["max_position_embeddings"]),
            hidden_size=int(self.spec["hidden_size"]),
            final_logit_softcapping=self.spec.final_logit_softcapping,
            **self.model_extras(),
        )

    # ---- hooks -----------------------------------------------------------------------------------
    def model_class(self) -> type[GemmaModel]:
        return GemmaModel

    def model_extras(self) -> dict[str, Any]:
        """Extra keyword arguments of `model_class`."""
        return {}

    def decoder_layer(self, i: int, layer: GemmaLayerSpec) -> Any:
        """Gemma 3's layer: the sandwich layer as is."""
        return self.sandwich_layer(i, layer)

    def norm_weight(self, name: str) -> np.ndarray:
        """Gemma 3 scales by ``1 + w``: the 1 is added here, once."""
        return self.tensor(name).astype(np.float32) + 1.0

    # ---- shared parts ----------------------------------------------------------------------------
    def norm(self, name: str) -> RMSNorm:
        weight = self.backend.from_numpy(self.norm_weight(name), weight=True)
        return self.layer_type("rms_norm")(self.backend, weight, float(self.spec["rms_norm_eps"]))

    def unit_norm(self, width: int) -> RMSNorm:
        """An RMSNorm without a learned scale."""
        weight = self.backend.from_numpy(np.ones(width, dtype=np.float32), weight=True)
        return self.layer_type("rms_norm")(self.backend, weight, float(self.spec["rms_norm_eps"]))

    def sandwich_layer(
        self, i: int, layer: GemmaLayerSpec, layer_class: type = SandwichDecoderLayer, **extra: Any
    ) -> Any:
        """Layer ``i`` as ``layer_class`` (a `SandwichDecoderLayer`), with ``extra`` constructor arguments."""
        p = f"{self.prefix}layers.{i}."
        return layer_class(
            input_norm=self.norm(p + "input_layernorm.weight"),
            mixer=self.attention(i, layer),
            post_mixer_norm=self.norm(p + "post_attention_layernorm.weight"),
            pre_ffn_norm=self.norm(p + "pre_feedforward_layernorm.weight"),
            ffn=self.mlp(p + "mlp."),
            post_ffn_norm=self.norm(p + "post_feedforward_layernorm.weight"),
            **extra,
        )

    def mlp(self, prefix: str) -> GeGLUMLP:
        return GeGLUMLP(
            self.backend, self.upload(prefix + "gate_proj.weight", prefix + "up_proj.weight"),
            self.upload(prefix + "down_proj.weight"),
        )

    def attention(self, i: int, layer: GemmaLayerSpec) -> Any:
        a = f"{self.prefix}layers.{i}.self_attn."
        bias = bool(self.spec["attention_bias"])
        shared = layer.kv_source != i
        values_from_keys = (
            self.family == "gemma4" and bool(self.spec["attention_k_eq_v"]) and layer.layer_type == FULL and not shared
        )
        projections = ["q"] if shared else ["q", "k"] if values_from_keys else ["q", "k", "v"]
        weights = AttentionWeights(
            qkv=self.upload(*(f"{a}{n}_proj.weight" for n in projections)),
            o=self.upload(a + "o_proj.weight"),
            qkv_bias=self.upload(*(f"{a}{n}_proj.bias" for n in projections)) if bias else None,
            o_bias=self.upload(a + "o_proj.bias") if bias else None,
            q_norm=self.norm(a + "q_norm.weight"),
            k_norm=None if shared else self.norm(a + "k_norm.weight"),
            v_norm=self.unit_norm(layer.head_dim) if self.family == "gemma4" and not shared else None,
            values_from_keys=values_from_keys,
        )
        cos, sin = self._rope_tables(layer)
        attention_class = SharedKVAttention if shared else self.layer_type("attention")
        return attention_class(
            self.backend, weights, layer_index=self.cache_slots[layer.kv_source],
            num_heads=int(self.spec["num_attention_heads"]), num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
            rope_cos=cos, rope_sin=sin, scale=self.spec.attention_scale, sliding_window=layer.sliding_window,
        )

    def _rope_tables(self, layer: GemmaLayerSpec) -> tuple[Array, Array]:
        key = (layer.layer_type, layer.head_dim)
        if key not in self._rope_cache:
            self._rope_cache[key] = self.rope_tables(layer.rope, int(self.spec["max_position_embeddings"]))
        return self._rope_cache[key]

    def _text_prefix(self) -> str:
        for prefix in TEXT_PREFIXES:
            if prefix + "embed_tokens.weight" in self.source:
                return prefix
        raise ModelLoadError(
            f"{self.origin}: no text-model embedding found (looked for "
            f"{', '.join(p + 'embed_tokens.weight' for p in TEXT_PREFIXES)})"
        )

    def _lm_head_name(self) -> str:
        for name in LM_HEAD_NAMES:
            if name in self.source:
                return name
        raise ModelLoadError(
            f"{self.origin}: tie_word_embeddings is false but the checkpoint has no output projection "
            f"({' or '.join(LM_HEAD_NAMES)})"
        )


class Gemma3Loader(GemmaLoader):
    """``gemma3_text`` (Gemma3ForCausalLM) and the text stack of ``gemma3`` (Gemma3ForConditionalGeneration)."""

    family = "gemma3"


class Gemma4Loader(GemmaLoader):
    """``gemma4_text`` (Gemma4ForCausalLM, dense or MoE) and the text stack of ``gemma4``
    (Gemma4ForConditionalGeneration). Norms scale by ``w`` (not ``1 + w``)."""

    family = "gemma4"

    def norm_weight(self, name: str) -> np.ndarray:
        return self.tensor(name)

    def model_class(self) -> type[GemmaModel]:
        return Gemma4Model

    def model_extras(self) -> dict[str, Any]:
        size, num_layers = self.spec.per_layer_input_size, len(self.spec.layers)
        if not size:
            return {"per_layer_inputs": None}
        inputs = PerLayerInputs(
            self.backend, self.upload(self.prefix + "embed_tokens_per_layer.weight"),
            self.upload(self.prefix + "per_layer_model_projection.weight"),
            self.norm(self.prefix + "per_layer_projection_norm.weight"), num_layers=num_layers, size=size,
        )
        return {"per_layer_inputs": inputs}

    def decoder_layer(self, i: int, layer: GemmaLayerSpec) -> Gemma4DecoderLayer:
        p = f"{self.prefix}layers.{i}."
        if self.spec.router is None:
            block = self.sandwich_layer(i, layer)
        else:
            block = self.sandwich_layer(
                i, layer, ParallelMoEDecoderLayer, post_dense_norm=self.norm(p + "post_feedforward_layernorm_1.weight"),
                pre_moe_norm=self.norm(p + "pre_feedforward_layernorm_2.weight"),
                router_norm=self.unit_norm(int(self.spec["hidden_size"])), moe=self.moe(p),
                post_moe_norm=self.norm(p + "post_feedforward_layernorm_2.weight"),
            )
        gate = None
        if self.spec.per_layer_input_size:
            gate = PerLayerInputGate(
                self.backend, self.upload(p + "per_layer_input_gate.weight"),
                self.upload(p + "per_layer_projection.weight"), self.norm(p + "post_per_layer_input_norm.weight"),
            )
        # transformers initialises a layer_scalar missing from a checkpoint to 1
        scalar = float(self.tensor(p + "layer_scalar").reshape(-1)[0]) if p + "layer_scalar" in self.source else 1.0
        return Gemma4DecoderLayer(self.backend, block, gate, scalar)

    def moe(self, p: str) -> MoEFeedForward:
        """The experts of layer prefix ``p``, with the router's input scale ``scale * hidden_size**-0.5``
        folded into the router weight's columns and ``per_expert_scale[e]`` into expert e's output
        projection (both exact rescalings of linear maps)."""
        spec = self.spec.router
        hidden = int(self.spec["hidden_size"])
        input_scale = self.tensor(p + "router.scale").astype(np.float32) * np.float32(hidden**-0.5)
        router = self.tensor(p + "router.proj.weight").astype(np.float32) * input_scale[None, :]
        w_in, w_out = read_experts(self, p + "experts.", spec.num_experts)
        expert_scale = self.tensor(p + "router.per_expert_scale").astype(np.float32)
        w_out = w_out.astype(np.float32) * expert_scale[:, None, None]
        experts = RoutedExperts.upload(self.backend, w_in, w_out, "gelu_tanh")
        return MoEFeedForward(self.backend, self.backend.from_numpy(router, weight=True), experts, spec)
