"""Gemma 3 / Gemma 4 checkpoints -> `GemmaModel` / `Gemma4Model`.

Weight names are Hugging Face's under the text stack's prefix: ``model.`` for the text-only
classes, ``model.language_model.`` for vision-language checkpoints (``language_model.model.`` in
ones saved before transformers 4.52). Gemma 3's vision side (SigLIP tower and projector) and Gemma 4's
(vision tower and embedder), when the checkpoint holds them, are attached as the model's `VisionModel`
(`atlas_model_gemma.attach`, `atlas_model_gemma.gemma4_attach`), on rank 0 alone when the model is split
over ranks (`loads_vision_tower`); Gemma 4's audio tower is not read.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.batch.kv_cache import KVLayout
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.expert_parallel import ExpertShard, read_expert_shard
from atlas_core.model.layers.moe import ExpertNames, MoEFeedForward, read_experts
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.weights.quantized import as_float
from atlas_model_gemma import gemma4_attach, shapes
from atlas_model_gemma.attach import attach_vision, has_tower, image_token, vision_shapes
from atlas_model_gemma.config import FULL, Family, GemmaLayerSpec, GemmaSpec, parse, text_config
from atlas_model_gemma.layers import Gemma4DecoderLayer, ParallelMoEDecoderLayer
from atlas_model_gemma.model import Gemma4Model, GemmaModel

TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
"""Where the text stack's weights may sit (see the module docstring)."""
LM_HEAD_PREFIXES = ("", "language_model.")
"""Where an untied ``lm_head.weight`` may sit."""


class GemmaLoader(ModelWeightLoader):
    """The parts Gemma 3 and Gemma 4 share; subclasses set `family` and build their layers."""

    family: ClassVar[Family]
    supports_tensor_parallel = True  # attention by heads, MLPs by rows, the vocabulary by rows
    supports_expert_parallel = True  # a rank holds its experts (`moe`)
    zero_centred_norms: ClassVar[bool] = True
    """Whether the checkpoint's RMSNorm weights are ``w`` of a norm scaling by ``1 + w`` (Gemma 3)."""

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads (`atlas_model_gemma.shapes`)."""
        return shapes.checkpoint_shapes(config, cls.family)

    def build(self) -> GemmaModel:
        self.spec: GemmaSpec = parse(self.source.config, self.family, f"{self.origin}/config.json")
        self.prefix = self.find_prefix(TEXT_PREFIXES, "embed_tokens.weight")
        self._rope_cache: dict[tuple[str, int], tuple[Array, Array]] = {}
        # one KV cache slot per layer that computes its own keys and values; KV-shared layers read their source's
        self.cache_slots: dict[int, int] = {}
        for i, layer in enumerate(self.spec.layers):
            if layer.kv_source == i:
                self.cache_slots[i] = len(self.cache_slots)
        embed, vocab_split = self.vocab_rows(self.prefix + "embed_tokens.weight")
        owners = [self.spec.layers[i] for i in self.cache_slots]
        return self.model_class()(
            self.backend,
            embed_tokens=embed,
            layers=[self.decoder_layer(i, self.spec.layers[i]) for i in self.layer_progress(len(self.spec.layers))],
            final_norm=self.norm(self.prefix + "norm.weight"),
            lm_head=embed if self.spec.tie_word_embeddings else self._lm_head(),
            kv_layouts=[KVLayout(len(self.kv_heads(layer)), layer.head_dim) for layer in owners],
            vocab_size=int(self.spec["vocab_size"]),
            max_position_embeddings=int(self.spec["max_position_embeddings"]),
            hidden_size=int(self.spec["hidden_size"]),
            final_logit_softcapping=self.spec.final_logit_softcapping,
            vocab_split=vocab_split,
            **self.model_extras(),
        )

    # ---- hooks -----------------------------------------------------------------------------------
    def model_class(self) -> type[GemmaModel]:
        """The model class `build` instantiates."""
        return GemmaModel

    def model_extras(self) -> dict[str, Any]:
        """Extra keyword arguments of `model_class`."""
        return {}

    def decoder_layer(self, i: int, layer: GemmaLayerSpec) -> Any:
        """Gemma 3's layer: the sandwich layer as is."""
        return self.sandwich_layer(i, layer)

    # ---- shared parts ----------------------------------------------------------------------------
    def norm(self, name: str) -> RMSNorm:
        """The RMSNorm with checkpoint weight ``name`` (`zero_centred_norms` says how it scales)."""
        return self.rms_norm(name, float(self.spec["rms_norm_eps"]), zero_centred=self.zero_centred_norms)

    def unit_norm(self, width: int) -> RMSNorm:
        """An RMSNorm without a learned scale."""
        weight = self.backend.from_numpy(np.ones(width, dtype=np.float32), weight=True)
        return self.layer_type("rms_norm")(self.backend, weight, float(self.spec["rms_norm_eps"]))

    def sandwich_layer(self, i: int, layer: GemmaLayerSpec, layer_class: type | None = None, **extra: Any) -> Any:
        """Layer ``i`` as ``layer_class`` (a `SandwichDecoderLayer` subclass; None: the registered
        ``sandwich_decoder_layer``), with ``extra`` constructor arguments."""
        p = f"{self.prefix}layers.{i}."
        return (layer_class or self.layer_type("sandwich_decoder_layer"))(
            input_norm=self.norm(p + "input_layernorm.weight"),
            mixer=self.reduced_mixer(self.attention(i, layer)),
            post_mixer_norm=self.norm(p + "post_attention_layernorm.weight"),
            pre_ffn_norm=self.norm(p + "pre_feedforward_layernorm.weight"),
            ffn=self.mlp(p + "mlp."),
            post_ffn_norm=self.norm(p + "post_feedforward_layernorm.weight"),
            **extra,
        )

    def mlp(self, prefix: str) -> Any:
        """The dense GeGLU feed-forward under ``prefix``."""
        return self.gated_mlp(prefix, layer="geglu_mlp")

    def attention(self, i: int, layer: GemmaLayerSpec) -> Any:
        """Layer ``i``'s attention: its own keys and values (``attention``), or, in a KV-shared layer,
        queries over the cache slot of its ``kv_source`` layer (``shared_kv_attention``)."""
        a = f"{self.prefix}layers.{i}.self_attn."
        bias = bool(self.spec["attention_bias"])
        shared = layer.kv_source != i
        values_from_keys = (
            self.family == "gemma4" and bool(self.spec["attention_k_eq_v"]) and layer.layer_type == FULL and not shared
        )
        projections = ["q"] if shared else ["q", "k"] if values_from_keys else ["q", "k", "v"]
        heads, kv_heads = (
            self.shard.split(int(self.spec["num_attention_heads"]), "num_attention_heads"),
            self.kv_heads(layer),
        )
        dim = layer.head_dim
        rows = {"q": range(heads.start * dim, heads.stop * dim), "k": range(kv_heads.start * dim, kv_heads.stop * dim)}
        rows["v"] = rows["k"]

        def parts(kind: str) -> list[Any]:
            return [self.weight_part(f"{a}{n}_proj.{kind}", rows[n]) for n in projections]

        weights = AttentionWeights(
            qkv=self.upload_arrays(*parts("weight")),
            o=self.upload_arrays(self.weight_part(a + "o_proj.weight", slice(None), rows["q"])),
            qkv_bias=self.upload_arrays(*parts("bias")) if bias else None,
            o_bias=self.row_parallel_bias(bias, a + "o_proj.bias"),
            q_norm=self.norm(a + "q_norm.weight"),
            k_norm=None if shared else self.norm(a + "k_norm.weight"),
            v_norm=self.unit_norm(layer.head_dim) if self.family == "gemma4" and not shared else None,
            values_from_keys=values_from_keys,
        )
        cos, sin = self._rope_tables(layer)
        attention_class = self.layer_type("shared_kv_attention" if shared else "attention")
        return attention_class(
            self.backend,
            weights,
            layer_index=self.cache_slots[layer.kv_source],
            num_heads=len(heads),
            num_kv_heads=len(kv_heads),
            head_dim=layer.head_dim,
            rope_cos=cos,
            rope_sin=sin,
            scale=self.spec.attention_scale,
            sliding_window=layer.sliding_window,
        )

    def kv_heads(self, layer: GemmaLayerSpec) -> range:
        """The key/value heads of ``layer`` this rank keeps (`ShardPlan.kv_heads`; all of them unsplit)."""
        return self.shard.kv_heads(layer.num_kv_heads, int(self.spec["num_attention_heads"]))

    def _rope_tables(self, layer: GemmaLayerSpec) -> tuple[Array, Array]:
        key = (layer.layer_type, layer.head_dim)
        if key not in self._rope_cache:
            self._rope_cache[key] = self.rope_tables(layer.rope, int(self.spec["max_position_embeddings"]))
        return self._rope_cache[key]

    def _lm_head(self) -> Array:
        """The untied output projection (tie_word_embeddings is false)."""
        return self.lm_head(self.find_prefix(LM_HEAD_PREFIXES, "lm_head.weight") + "lm_head.weight")


class Gemma3Loader(GemmaLoader):
    """``gemma3_text`` (Gemma3ForCausalLM) and ``gemma3`` (Gemma3ForConditionalGeneration): the text stack,
    and for a ``gemma3`` checkpoint that holds the SigLIP tower, its vision side (``model.vision``)."""

    family = "gemma3"

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The text stack's tensors, and the vision side's for a ``gemma3`` config with a ``vision_config``
        whose image token is inside the vocabulary (the tower `build` attaches)."""
        described = super().checkpoint_shapes(config)
        text = parse(config, cls.family, "config.json")
        if config.get("model_type") != "gemma3" or not isinstance(config.get("vision_config"), dict):
            return described
        if image_token(config, int(text["vocab_size"])) is None:  # read as a text model (`attach_vision`)
            return described
        return described | vision_shapes(config, int(text["hidden_size"]))

    def build(self) -> GemmaModel:
        model = super().build()
        if self.source.config.get("model_type") == "gemma3" and has_tower(self) and self.loads_vision_tower:
            model.vision = attach_vision(self, int(self.spec["vocab_size"]))
        return model


class Gemma4Loader(GemmaLoader):
    """``gemma4_text`` (Gemma4ForCausalLM, dense or MoE) and ``gemma4`` (Gemma4ForConditionalGeneration): the
    text stack, and for a ``gemma4`` checkpoint that holds the vision tower, its vision side
    (``model.vision``). Norms scale by ``w`` (not ``1 + w``)."""

    family = "gemma4"
    zero_centred_norms = False

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The text stack's tensors, and the vision side's for a ``gemma4`` config with a ``vision_config``."""
        described = super().checkpoint_shapes(config)
        if config.get("model_type") != "gemma4" or not isinstance(config.get("vision_config"), dict):
            return described
        text = parse(config, cls.family, "config.json")
        return described | gemma4_attach.gemma4_vision_shapes(config, int(text["hidden_size"]))

    def build(self) -> GemmaModel:
        model = super().build()
        is_gemma4 = self.source.config.get("model_type") == "gemma4"
        if is_gemma4 and gemma4_attach.has_tower(self) and self.loads_vision_tower:
            model.vision = gemma4_attach.attach_gemma4_vision(self, text_config(self.source.config))
        return model

    def model_class(self) -> type[GemmaModel]:
        return Gemma4Model

    def model_extras(self) -> dict[str, Any]:
        size, num_layers = self.spec.per_layer_input_size, len(self.spec.layers)
        pad = self.spec.text.get("pad_token_id")
        extras: dict[str, Any] = {
            "full_attention_layers": [i for i, layer in enumerate(self.spec.layers) if layer.layer_type == FULL],
            "pad_token_id": 0 if pad is None else int(pad),
        }
        if not size:
            return extras | {"per_layer_inputs": None}
        inputs = self.layer_type("per_layer_inputs")(
            self.backend,
            self.upload(self.prefix + "embed_tokens_per_layer.weight"),
            self.upload(self.prefix + "per_layer_model_projection.weight"),
            self.norm(self.prefix + "per_layer_projection_norm.weight"),
            num_layers=num_layers,
            size=size,
        )
        return extras | {"per_layer_inputs": inputs}

    def decoder_layer(self, i: int, layer: GemmaLayerSpec) -> Gemma4DecoderLayer:
        p = f"{self.prefix}layers.{i}."
        if self.spec.router is None:
            block = self.sandwich_layer(i, layer)
        else:
            block = self.sandwich_layer(
                i,
                layer,
                ParallelMoEDecoderLayer,
                post_dense_norm=self.norm(p + "post_feedforward_layernorm_1.weight"),
                pre_moe_norm=self.norm(p + "pre_feedforward_layernorm_2.weight"),
                router_norm=self.unit_norm(int(self.spec["hidden_size"])),
                moe=self.moe(p),
                post_moe_norm=self.norm(p + "post_feedforward_layernorm_2.weight"),
            )
        gate = None
        if self.spec.per_layer_input_size:
            gate = self.layer_type("per_layer_input_gate")(
                self.backend,
                self.upload(p + "per_layer_input_gate.weight"),
                self.upload(p + "per_layer_projection.weight"),
                self.norm(p + "post_per_layer_input_norm.weight"),
            )
        # transformers initialises a layer_scalar missing from a checkpoint to 1
        scalar = float(self.tensor(p + "layer_scalar").reshape(-1)[0]) if p + "layer_scalar" in self.source else 1.0
        return Gemma4DecoderLayer(self.backend, block, gate, scalar)

    def moe(self, p: str) -> MoEFeedForward:
        """The experts of layer prefix ``p``, with the router's input scale ``scale * hidden_size**-0.5``
        folded into the router weight's columns and ``per_expert_scale[e]`` into expert e's output
        projection (both exact rescalings of linear maps)."""
        spec = self.spec.router
        assert spec is not None  # called only for MoE configs
        hidden = int(self.spec["hidden_size"])
        input_scale = self.tensor(p + "router.scale").astype(np.float32) * np.float32(hidden**-0.5)
        router = self.tensor(p + "router.proj.weight").astype(np.float32) * input_scale[None, :]
        held = range(spec.num_experts)
        if self.shard.is_split:  # expert parallelism: this rank's experts, the block sums the ranks' parts
            held, w_in, w_out = read_expert_shard(self, p + "experts.", spec.num_experts, ExpertNames())
        else:
            w_in, w_out = read_experts(self, p + "experts.", spec.num_experts)
        expert_scale = self.float_part(p + "router.per_expert_scale", held).astype(np.float32)
        w_out = as_float(w_out).astype(np.float32) * expert_scale[:, None, None]
        experts: Any = self.layer_type("routed_experts").upload(self.backend, w_in, w_out, "gelu_tanh")
        if self.shard.is_split and self.parallel is not None:
            experts = ExpertShard(experts, held, spec.num_experts)
            reduce = self.parallel.comm.all_reduce
            return self.layer_type("moe")(self.backend, self.upload_arrays(router), experts, spec, all_reduce=reduce)
        return self.layer_type("moe")(self.backend, self.upload_arrays(router), experts, spec)
