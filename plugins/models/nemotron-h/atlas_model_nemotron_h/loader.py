"""Nemotron-H: a stack of one-mixer pre-norm blocks, each a Mamba-2 mixer, attention (no RoPE), a
squared-ReLU MLP, or a MoE (sigmoid routing with correction bias, non-gated squared-ReLU experts, a
shared expert, optional latent projections).

Weights are read under ``backbone.`` (NVIDIA's checkpoints, and what transformers saves) or ``model.``;
experts per expert (``experts.{e}.up_proj.weight``) or stacked (``experts.up_proj``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.engine.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.mamba2 import Mamba2Mixer, Mamba2Weights
from atlas_core.model.layers.moe import NON_GATED_EXPERT_NAMES, MoEFeedForward, RoutedExperts, read_experts
from atlas_core.model.layers.relu2_mlp import SquaredReLUMLP
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.model.transformer import TransformerModel

from atlas_model_nemotron_h.blocks import LatentMoE, PreNormBlock
from atlas_model_nemotron_h.config import NemotronHSpec

F32 = np.dtype(np.float32)
PREFIXES = ("backbone.", "model.")


class NemotronHLoader(ModelWeightLoader):
    """Builds a Nemotron-H hybrid from its checkpoint (`NemotronHSpec` reads the config)."""

    def build(self) -> TransformerModel:
        spec = NemotronHSpec.from_config(self.source.config, origin=f"{self.origin}/config.json")
        prefix = self._prefix()
        norm_type = self.layer_type("rms_norm")
        state = RecurrentState() if "mamba" in spec.layer_kinds else None
        kv_layouts: list[KVLayout] = []
        layers = []
        for i, kind in enumerate(spec.layer_kinds):
            p = f"{prefix}layers.{i}."
            if kind == "mamba":
                assert state is not None
                mixer: Any = self._mamba(spec, p + "mixer.", i, state)
            elif kind == "attention":
                mixer = self._attention(spec, p + "mixer.", len(kv_layouts))
                kv_layouts.append(KVLayout(spec.num_kv_heads, spec.head_dim))
            elif kind == "mlp":
                mixer = self._mlp(p + "mixer.", spec.mlp_bias)
            else:
                mixer = self._moe(spec, p + "mixer.")
            norm = norm_type(self.backend, self.upload(p + "norm.weight"), spec.norm_eps)
            layers.append(PreNormBlock(norm, mixer, mixes_tokens=kind in ("mamba", "attention")))

        embed = self.upload(prefix + "embeddings.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=norm_type(self.backend, self.upload(prefix + "norm_f.weight"), spec.norm_eps),
            lm_head=embed if spec.tie_word_embeddings else self.upload("lm_head.weight"),
            kv_layouts=kv_layouts,
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
            recurrent_state=state,
        )

    def _prefix(self) -> str:
        for prefix in PREFIXES:
            if prefix + "embeddings.weight" in self.source:
                return prefix
        raise ModelLoadError(
            f"{self.origin}: no Nemotron-H embedding weight ({' or '.join(p + 'embeddings.weight' for p in PREFIXES)})"
        )

    def _optional(self, flag: bool, name: str) -> Array | None:
        return self.upload(name) if flag else None

    def _float32(self, array: np.ndarray) -> Array:
        return self.backend.from_numpy(np.asarray(array, dtype=F32), dtype=F32)

    def _mamba(self, spec: NemotronHSpec, m: str, layer: int, state: RecurrentState) -> Mamba2Mixer:
        shape = spec.mamba
        in_proj = self.tensor(m + "in_proj.weight")
        conv = self.tensor(m + "conv1d.weight")
        expected = {
            "in_proj.weight": (shape.in_proj_size, spec.hidden_size), "conv1d.weight": (shape.conv_dim, 1, shape.conv_kernel),
        }
        for name, array in (("in_proj.weight", in_proj), ("conv1d.weight", conv)):
            if tuple(array.shape) != expected[name]:
                raise ModelLoadError(
                    f"{self.origin}: {m}{name} has shape {tuple(array.shape)}, but the config (mamba_num_heads "
                    f"{shape.num_heads}, mamba_head_dim {shape.head_dim}, n_groups {shape.n_groups}, ssm_state_size "
                    f"{shape.state_size}, conv_kernel {shape.conv_kernel}) implies {expected[name]}"
                )
        weights = Mamba2Weights(
            in_proj=self.backend.from_numpy(in_proj, weight=True),
            conv=self.backend.from_numpy(conv.reshape(shape.conv_dim, shape.conv_kernel), weight=True),
            A=self._float32(-np.exp(self.tensor(m + "A_log").astype(F32))),
            D=self._float32(self.tensor(m + "D")),
            dt_bias=self._float32(self.tensor(m + "dt_bias")),
            norm=self.upload(m + "norm.weight"),
            out_proj=self.upload(m + "out_proj.weight"),
            in_proj_bias=self._optional(spec.mamba_bias, m + "in_proj.bias"),
            conv_bias=self._optional(spec.conv_bias, m + "conv1d.bias"),
            out_proj_bias=self._optional(spec.mamba_bias, m + "out_proj.bias"),
        )
        Mamba2Mixer.declare_state(state, layer, shape)
        return Mamba2Mixer(self.backend, weights, shape, layer_index=layer, state=state)

    def _attention(self, spec: NemotronHSpec, a: str, cache_index: int) -> Any:
        weights = AttentionWeights(
            qkv=self.upload(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            o=self.upload(a + "o_proj.weight"),
        )
        return self.layer_type("attention")(
            self.backend, weights, layer_index=cache_index, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim, rope_cos=None, rope_sin=None,  # no RoPE in Nemotron-H
        )

    def _mlp(self, m: str, bias: bool) -> SquaredReLUMLP:
        return SquaredReLUMLP(
            self.backend, self.upload(m + "up_proj.weight"), self.upload(m + "down_proj.weight"),
            self._optional(bias, m + "up_proj.bias"), self._optional(bias, m + "down_proj.bias"),
        )

    def _moe(self, spec: NemotronHSpec, m: str) -> Any:
        settings = spec.moe
        assert settings is not None
        w_in, w_out = read_experts(self, m + "experts.", settings.router.num_experts, NON_GATED_EXPERT_NAMES)
        width = spec.hidden_size if settings.latent_size is None else settings.latent_size
        if w_in.shape[1:] != (settings.intermediate_size, width) or w_out.shape[1:] != (width, settings.intermediate_size):
            raise ModelLoadError(
                f"{self.origin}: experts under {m}experts. are {w_in.shape} / {w_out.shape}, but the config "
                f"(moe_intermediate_size {settings.intermediate_size}, width {width}) implies "
                f"[E, {settings.intermediate_size}, {width}] / [E, {width}, {settings.intermediate_size}]"
            )
        experts = RoutedExperts.upload(self.backend, w_in, w_out, "relu2")
        shared = self._mlp(m + "shared_experts.", spec.mlp_bias)
        router = self.upload(m + "gate.weight")
        bias = self._float32(self.tensor(m + "gate.e_score_correction_bias"))
        if settings.latent_size is None:
            return MoEFeedForward(self.backend, router, experts, settings.router, correction_bias=bias, shared_expert=shared)
        moe = MoEFeedForward(self.backend, router, experts, settings.router, correction_bias=bias)
        return LatentMoE(
            self.backend, moe, shared, self.upload(m + "fc1_latent_proj.weight"), self.upload(m + "fc2_latent_proj.weight"),
            self._optional(spec.mlp_bias, m + "fc1_latent_proj.bias"), self._optional(spec.mlp_bias, m + "fc2_latent_proj.bias"),
        )
