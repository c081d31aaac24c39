"""Nemotron-H: a stack of one-mixer pre-norm blocks, each a Mamba-2 mixer, attention (no RoPE), a
squared-ReLU MLP, or a MoE (sigmoid routing with correction bias, non-gated squared-ReLU experts, a
shared expert, optional latent projections).

Weights are read under ``backbone.`` (NVIDIA's checkpoints, and what transformers saves) or ``model.``;
experts per expert (``experts.{e}.up_proj.weight``) or stacked (``experts.up_proj``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.batch.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.mamba2 import Mamba2Weights
from atlas_core.model.layers.moe import NON_GATED_EXPERT_NAMES, read_experts
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.transformer import TransformerModel
from atlas_model_nemotron_h import shapes
from atlas_model_nemotron_h.blocks import LatentMoE, PreNormBlock
from atlas_model_nemotron_h.config import NemotronHSpec

PREFIXES = ("backbone.", "model.")


class NemotronHLoader(ModelWeightLoader):
    """Builds a Nemotron-H hybrid from its checkpoint (`NemotronHSpec` reads the config)."""

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads (`atlas_model_nemotron_h.shapes`)."""
        return shapes.checkpoint_shapes(config)

    def build(self) -> TransformerModel:
        spec = NemotronHSpec.from_config(self.source.config, origin=f"{self.origin}/config.json")
        prefix = self.find_prefix(PREFIXES, "embeddings.weight")
        state = RecurrentState() if "mamba" in spec.layer_kinds else None
        kv_layouts: list[KVLayout] = []
        layers = []
        for i in self.layer_progress(len(spec.layer_kinds)):
            kind, p = spec.layer_kinds[i], f"{prefix}layers.{i}."
            if kind == "mamba":
                assert state is not None
                mixer: Any = self._mamba(spec, p + "mixer.", i, state)
            elif kind == "attention":
                mixer = self._attention(spec, p + "mixer.", len(kv_layouts))
                kv_layouts.append(KVLayout(spec.num_kv_heads, spec.head_dim, None, *self.kv_scales(p + "mixer.")))
            elif kind == "mlp":
                mixer = self._mlp(p + "mixer.", spec.mlp_bias)
            else:
                mixer = self._moe(spec, p + "mixer.")
            norm = self.rms_norm(p + "norm.weight", spec.norm_eps)
            layers.append(PreNormBlock(norm, mixer, mixes_tokens=kind in ("mamba", "attention")))

        embed = self.upload(prefix + "embeddings.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=self.rms_norm(prefix + "norm_f.weight", spec.norm_eps),
            lm_head=embed if spec.tie_word_embeddings else self.upload("lm_head.weight"),
            kv_layouts=kv_layouts,
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
            recurrent_state=state,
        )

    def _mamba(self, spec: NemotronHSpec, m: str, layer: int, state: RecurrentState) -> Any:
        shape = spec.mamba
        in_proj = self.tensor(m + "in_proj.weight")
        conv = self.tensor(m + "conv1d.weight")
        config_sizes = (
            f"the config (mamba_num_heads {shape.num_heads}, mamba_head_dim {shape.head_dim}, n_groups "
            f"{shape.n_groups}, ssm_state_size {shape.state_size}, conv_kernel {shape.conv_kernel})"
        )
        self.check_shape(m + "in_proj.weight", in_proj.shape, (shape.in_proj_size, spec.hidden_size), config_sizes)
        self.check_shape(m + "conv1d.weight", conv.shape, (shape.conv_dim, 1, shape.conv_kernel), config_sizes)
        weights = Mamba2Weights(
            in_proj=self.upload_arrays(in_proj),
            conv=self.upload_arrays(conv.reshape(shape.conv_dim, shape.conv_kernel)),
            A=self.upload_float32(-np.exp(self.tensor(m + "A_log").astype(np.float32))),
            D=self.upload_float32(self.tensor(m + "D")),
            dt_bias=self.upload_float32(self.tensor(m + "dt_bias")),
            norm=self.upload(m + "norm.weight"),
            out_proj=self.upload(m + "out_proj.weight"),
            in_proj_bias=self.optional_upload(spec.mamba_bias, m + "in_proj.bias"),
            conv_bias=self.optional_upload(spec.conv_bias, m + "conv1d.bias"),
            out_proj_bias=self.optional_upload(spec.mamba_bias, m + "out_proj.bias"),
        )
        return self.layer_type("mamba2")(self.backend, weights, shape, layer_index=layer, state=state)

    def _attention(self, spec: NemotronHSpec, a: str, cache_index: int) -> Any:
        weights = AttentionWeights(
            qkv=self.upload(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            o=self.upload(a + "o_proj.weight"),
        )
        return self.layer_type("attention")(
            self.backend,
            weights,
            layer_index=cache_index,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            rope_cos=None,
            rope_sin=None,  # no RoPE in Nemotron-H
        )

    def _mlp(self, m: str, bias: bool) -> Any:
        return self.layer_type("relu2_mlp")(
            self.backend,
            self.upload(m + "up_proj.weight"),
            self.upload(m + "down_proj.weight"),
            self.optional_upload(bias, m + "up_proj.bias"),
            self.optional_upload(bias, m + "down_proj.bias"),
        )

    def _moe(self, spec: NemotronHSpec, m: str) -> Any:
        settings = spec.moe
        assert settings is not None
        w_in, w_out = read_experts(self, m + "experts.", settings.router.num_experts, NON_GATED_EXPERT_NAMES)
        width = spec.hidden_size if settings.latent_size is None else settings.latent_size
        if w_in.shape[1:] != (settings.intermediate_size, width) or w_out.shape[1:] != (
            width,
            settings.intermediate_size,
        ):
            raise ModelLoadError(
                f"{self.origin}: experts under {m}experts. are {w_in.shape} / {w_out.shape}, but the config "
                f"(moe_intermediate_size {settings.intermediate_size}, width {width}) implies "
                f"[E, {settings.intermediate_size}, {width}] / [E, {width}, {settings.intermediate_size}]"
            )
        experts = self.layer_type("routed_experts").upload(self.backend, w_in, w_out, "relu2")
        shared = self._mlp(m + "shared_experts.", spec.mlp_bias)
        router = self.upload(m + "gate.weight")
        bias = self.upload_float32(self.tensor(m + "gate.e_score_correction_bias"))
        moe_type = self.layer_type("moe")
        if settings.latent_size is None:
            return moe_type(self.backend, router, experts, settings.router, correction_bias=bias, shared_expert=shared)
        moe = moe_type(self.backend, router, experts, settings.router, correction_bias=bias)
        return LatentMoE(
            self.backend,
            moe,
            shared,
            self.upload(m + "fc1_latent_proj.weight"),
            self.upload(m + "fc2_latent_proj.weight"),
            self.optional_upload(spec.mlp_bias, m + "fc1_latent_proj.bias"),
            self.optional_upload(spec.mlp_bias, m + "fc2_latent_proj.bias"),
        )
