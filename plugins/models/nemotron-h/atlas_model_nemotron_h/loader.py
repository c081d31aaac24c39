"""Nemotron-H: a stack of one-mixer pre-norm blocks, each a Mamba-2 mixer, attention (no RoPE), a
squared-ReLU MLP, or a MoE (sigmoid routing with correction bias, non-gated squared-ReLU experts, a
shared expert, optional latent projections).

Weights are read under ``backbone.`` (NVIDIA's checkpoints, and what transformers saves) or ``model.``;
experts per expert (``experts.{e}.up_proj.weight``) or stacked (``experts.up_proj``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from atlas_core.batch.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.layers.expert_parallel import ExpertShard, read_expert_shard
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
    """Builds a Nemotron-H hybrid from its checkpoint (`NemotronHSpec` reads the config). Split by tensor
    parallelism, a rank keeps its attention heads, its Mamba-2 groups with their heads, and its rows of
    every MLP; by expert parallelism, its experts."""

    supports_tensor_parallel = True
    supports_expert_parallel = True

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads (`atlas_model_nemotron_h.shapes`)."""
        return shapes.checkpoint_shapes(config)

    def build(self) -> TransformerModel:
        spec = NemotronHSpec.from_config(self.source.config, origin=f"{self.origin}/config.json")
        prefix = self.find_prefix(PREFIXES, "embeddings.weight")
        state = RecurrentState() if "mamba" in spec.layer_kinds else None
        kv_heads = self.shard.kv_heads(spec.num_kv_heads, spec.num_heads)
        kv_layouts: list[KVLayout] = []
        layers = []
        for i in self.layer_progress(len(spec.layer_kinds)):
            kind, p = spec.layer_kinds[i], f"{prefix}layers.{i}."
            if kind == "mamba":
                assert state is not None
                mixer: Any = self.reduced_mixer(self._mamba(spec, p + "mixer.", i, state))
            elif kind == "attention":
                mixer = self.reduced_mixer(self._attention(spec, p + "mixer.", len(kv_layouts)))
                kv_layouts.append(KVLayout(len(kv_heads), spec.head_dim, None, *self.kv_scales(p + "mixer.")))
            elif kind == "mlp":
                mixer = self.reduced_feed_forward(self._mlp(p + "mixer.", spec.mlp_bias))
            else:
                mixer = self._moe(spec, p + "mixer.")
            norm = self.rms_norm(p + "norm.weight", spec.norm_eps)
            layers.append(PreNormBlock(norm, mixer, mixes_tokens=kind in ("mamba", "attention")))

        embed, vocab_split = self.vocab_rows(prefix + "embeddings.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=self.rms_norm(prefix + "norm_f.weight", spec.norm_eps),
            lm_head=embed if spec.tie_word_embeddings else self.lm_head("lm_head.weight"),
            kv_layouts=kv_layouts,
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
            recurrent_state=state,
            vocab_split=vocab_split,
        )

    def _mamba(self, spec: NemotronHSpec, m: str, layer: int, state: RecurrentState) -> Any:
        """The Mamba-2 mixer under ``m``: this rank's groups of B/C and their heads (all of them unsplit)."""
        whole = spec.mamba
        config_sizes = (
            f"the config (mamba_num_heads {whole.num_heads}, mamba_head_dim {whole.head_dim}, n_groups "
            f"{whole.n_groups}, ssm_state_size {whole.state_size}, conv_kernel {whole.conv_kernel})"
        )
        in_shape, conv_shape = self.weight_shape(m + "in_proj.weight"), self.weight_shape(m + "conv1d.weight")
        self.check_shape(m + "in_proj.weight", in_shape, (whole.in_proj_size, spec.hidden_size), config_sizes)
        self.check_shape(m + "conv1d.weight", conv_shape, (whole.conv_dim, 1, whole.conv_kernel), config_sizes)
        groups = self.shard.split(whole.n_groups, "n_groups")
        per_group = whole.num_heads // whole.n_groups
        heads = range(groups.start * per_group, groups.stop * per_group)
        shape = replace(whole, num_heads=len(heads), n_groups=len(groups))
        inner, width, p, n = whole.inner_size, whole.n_groups * whole.state_size, whole.head_dim, whole.state_size
        xbc = [span(heads, p), span(groups, n, inner), span(groups, n, inner + width)]  # channels of x, B, C
        in_rows = [span(heads, p), *(span(r, 1, inner) for r in xbc), span(heads, 1, inner + whole.conv_dim)]

        def rows(name: str, parts: list[range]) -> np.ndarray:
            return np.concatenate([self.float_part(m + name, part) for part in parts])

        conv = rows("conv1d.weight", xbc)
        weights = Mamba2Weights(
            in_proj=self.upload_arrays(rows("in_proj.weight", in_rows)),
            conv=self.upload_arrays(conv.reshape(shape.conv_dim, shape.conv_kernel)),
            A=self.upload_float32(-np.exp(self.float_part(m + "A_log", heads).astype(np.float32))),
            D=self.upload_float32(self.float_part(m + "D", heads)),
            dt_bias=self.upload_float32(self.float_part(m + "dt_bias", heads)),
            norm=self.upload_arrays(self.float_part(m + "norm.weight", span(heads, p))),
            out_proj=self.upload_arrays(self.weight_part(m + "out_proj.weight", slice(None), span(heads, p))),
            in_proj_bias=self.upload_arrays(rows("in_proj.bias", in_rows)) if spec.mamba_bias else None,
            conv_bias=self.upload_arrays(rows("conv1d.bias", xbc)) if spec.conv_bias else None,
            out_proj_bias=self.row_parallel_bias(spec.mamba_bias, m + "out_proj.bias"),
        )
        return self.layer_type("mamba2")(self.backend, weights, shape, layer_index=layer, state=state)

    def _attention(self, spec: NemotronHSpec, a: str, cache_index: int) -> Any:
        heads = self.shard.split(spec.num_heads, "num_attention_heads")
        kv_rows = span(self.shard.kv_heads(spec.num_kv_heads, spec.num_heads), spec.head_dim)
        q_rows = span(heads, spec.head_dim)
        weights = AttentionWeights(
            qkv=self.upload_arrays(
                *(
                    self.weight_part(a + f"{x}_proj.weight", r)
                    for x, r in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))
                )
            ),
            o=self.upload_arrays(self.weight_part(a + "o_proj.weight", slice(None), q_rows)),
        )
        return self.layer_type("attention")(
            self.backend,
            weights,
            layer_index=cache_index,
            num_heads=len(heads),
            num_kv_heads=len(kv_rows) // spec.head_dim,
            head_dim=spec.head_dim,
            rope_cos=None,
            rope_sin=None,  # no RoPE in Nemotron-H
        )

    def _mlp(self, m: str, bias: bool) -> Any:
        """The squared-ReLU MLP under ``m``; split, this rank's intermediate rows, unreduced (callers wrap it
        with `reduced_feed_forward`, or a MoE block reduces it with its experts)."""
        rows: range | slice = slice(None)
        if self.shard.tensor_split:
            rows = self.shard.split(self.weight_shape(m + "down_proj.weight")[1], m + "intermediate rows")
        return self.layer_type("relu2_mlp")(
            self.backend,
            self.upload_arrays(self.weight_part(m + "up_proj.weight", rows)),
            self.upload_arrays(self.weight_part(m + "down_proj.weight", slice(None), rows)),
            self.upload_arrays(self.weight_part(m + "up_proj.bias", rows)) if bias else None,
            self.row_parallel_bias(bias, m + "down_proj.bias"),
        )

    def _moe(self, spec: NemotronHSpec, m: str) -> Any:
        settings = spec.moe
        assert settings is not None
        num_experts, split = settings.router.num_experts, self.shard.is_split
        if split:
            held, w_in, w_out = read_expert_shard(self, m + "experts.", num_experts, NON_GATED_EXPERT_NAMES)
        else:
            w_in, w_out = read_experts(self, m + "experts.", num_experts, NON_GATED_EXPERT_NAMES)
        width = spec.hidden_size if settings.latent_size is None else settings.latent_size
        inter = len(self.shard.expert_rows(settings.intermediate_size)) if split else settings.intermediate_size
        if w_in.shape[1:] != (inter, width) or w_out.shape[1:] != (width, inter):
            raise ModelLoadError(
                f"{self.origin}: experts under {m}experts. are {w_in.shape} / {w_out.shape}, but the config "
                f"(moe_intermediate_size {settings.intermediate_size}, width {width}) implies "
                f"[E, {settings.intermediate_size}, {width}] / [E, {width}, {settings.intermediate_size}]"
            )
        experts: Any = self.layer_type("routed_experts").upload(self.backend, w_in, w_out, "relu2")
        if split:
            experts = ExpertShard(experts, held, num_experts)
        all_reduce = self.parallel.comm.all_reduce if split and self.parallel is not None else None
        shared = self._mlp(m + "shared_experts.", spec.mlp_bias)
        router = self.upload(m + "gate.weight")
        bias = self.upload_float32(self.tensor(m + "gate.e_score_correction_bias"))
        moe_type = self.layer_type("moe")
        if settings.latent_size is None:  # the shared expert's row share (TP), or whole on rank 0 alone (EP)
            keep = self.shard.tensor_split or self.shard.rank == 0
            return moe_type(
                self.backend,
                router,
                experts,
                settings.router,
                correction_bias=bias,
                shared_expert=shared if keep else None,
                all_reduce=all_reduce,
            )
        moe = moe_type(self.backend, router, experts, settings.router, correction_bias=bias, all_reduce=all_reduce)
        return LatentMoE(  # the routed part is reduced in latent width; the shared expert is whole on every rank
            self.backend,
            moe,
            self.reduced_feed_forward(shared),
            self.upload(m + "fc1_latent_proj.weight"),
            self.upload(m + "fc2_latent_proj.weight"),
            self.optional_upload(spec.mlp_bias, m + "fc1_latent_proj.bias"),
            self.optional_upload(spec.mlp_bias, m + "fc2_latent_proj.bias"),
        )


def span(heads: range, width: int, offset: int = 0) -> range:
    """The rows of ``heads`` (or groups), each ``width`` rows wide, in a tensor whose first starts at ``offset``."""
    return range(offset + heads.start * width, offset + heads.stop * width)
