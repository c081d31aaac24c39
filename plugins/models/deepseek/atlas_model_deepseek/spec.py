"""`DeepseekSpec`: what a ``deepseek_v3`` or ``mistral4`` config says about the model's shape.

Both families share transformers' DeepSeek-V3 modelling: MLA attention, dense SwiGLU MLPs in the
first ``first_k_dense_replace`` layers and Mixture-of-Experts (routed + shared experts) after. They
differ in the router (DeepSeek-V3: sigmoid scores with ``e_score_correction_bias``; Mistral 4:
softmax scores, no bias), in the RoPE head size the config's rope parameters refer to, and in
Mistral 4's position-dependent query scaling (``llama_4_scaling_beta``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from atlas_core.backends.ops.moe import RouterSpec
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.mla import MLAShape
from atlas_core.model.rope import RopeSpec, mscale_softmax_factor
from atlas_core.model.spec import require

Family = Literal["deepseek_v3", "mistral4"]


@dataclass(frozen=True)
class DeepseekSpec:
    """The parsed config of one DeepSeek-V3-style checkpoint (see the module docstring)."""

    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    mla: MLAShape
    rope: RopeSpec
    rope_interleave: bool
    softmax_scale: float
    intermediate_size: int
    first_k_dense_replace: int
    router: RouterSpec
    moe_intermediate_size: int
    num_shared_experts: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    llama4_scaling_beta: float | None
    llama4_original_context: int
    num_mtp_layers: int = 0
    """DeepSeek-V3's ``num_nextn_predict_layers``: the multi-token-prediction layers the checkpoint may
    store after its decoder layers (``layers.{num_layers + k}``)."""

    @classmethod
    def from_config(cls, config: dict[str, Any], family: Family, origin: str = "config.json") -> DeepseekSpec:
        """Parse ``config``; a `ModelLoadError` names the key and the file when something is missing or unsupported."""
        activation = config.get("hidden_act", "silu")
        if activation != "silu":
            raise ModelLoadError(f"{origin}: hidden_act {activation!r} is not supported (only 'silu')")
        heads = int(require(config, "num_attention_heads", origin))
        q_lora = config.get("q_lora_rank")
        mla = MLAShape(
            heads=heads,
            nope_dim=int(require(config, "qk_nope_head_dim", origin)),
            rope_dim=int(require(config, "qk_rope_head_dim", origin)),
            v_dim=int(require(config, "v_head_dim", origin)),
            latent_dim=int(require(config, "kv_lora_rank", origin)),
            q_lora_rank=None if q_lora is None else int(q_lora),
        )
        qk_head_dim = mla.nope_dim + mla.rope_dim
        rope = _rope_spec(config, family, mla, origin)
        num_experts = int(require(config, "n_routed_experts", origin))
        router = _router_spec(config, family, num_experts, origin)
        beta = rope.scaling.get("llama_4_scaling_beta") if family == "mistral4" else None
        max_positions = int(config.get("max_position_embeddings", 4096))
        return cls(
            family=family,
            vocab_size=int(require(config, "vocab_size", origin)),
            hidden_size=int(require(config, "hidden_size", origin)),
            num_layers=int(require(config, "num_hidden_layers", origin)),
            mla=mla,
            rope=rope,
            rope_interleave=bool(config.get("rope_interleave", True)),
            softmax_scale=qk_head_dim**-0.5 * mscale_softmax_factor(rope),
            intermediate_size=int(require(config, "intermediate_size", origin)),
            first_k_dense_replace=int(config.get("first_k_dense_replace") or 0),
            router=router,
            moe_intermediate_size=int(require(config, "moe_intermediate_size", origin)),
            num_shared_experts=int(config.get("n_shared_experts") or 0),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            llama4_scaling_beta=None if beta is None else float(beta),
            # transformers defaults original_max_position_embeddings to max_position_embeddings
            llama4_original_context=int(rope.scaling.get("original_max_position_embeddings") or max_positions),
            num_mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
        )

    def is_moe_layer(self, layer: int) -> bool:
        """DeepSeek-V3's rule: the first ``first_k_dense_replace`` layers are dense, every later one MoE."""
        return layer >= self.first_k_dense_replace

    def position_scale_table(self, length: int) -> np.ndarray | None:
        """Mistral 4's per-position query scale ``1 + beta * ln(1 + floor(p / original_context))`` as a
        float32 ``[length]`` table, or None when the config has no such scaling."""
        if self.llama4_scaling_beta is None:
            return None
        positions = np.arange(length, dtype=np.float64)
        table = 1.0 + self.llama4_scaling_beta * np.log1p(np.floor(positions / self.llama4_original_context))
        return table.astype(np.float32)


def _rope_spec(config: dict[str, Any], family: Family, mla: MLAShape, origin: str) -> RopeSpec:
    """The RoPE head size transformers uses is the config's ``head_dim``, by default
    ``qk_rope_head_dim`` for DeepSeek-V3 and the whole query head ``Dn + R`` for Mistral 4, where
    ``partial_rotary_factor`` (default ``R / (Dn + R)``) selects the rotary part."""
    if family == "deepseek_v3":
        rope = RopeSpec.from_config(config, int(config.get("head_dim") or mla.rope_dim))
    else:
        head_dim = int(config.get("head_dim") or mla.nope_dim + mla.rope_dim)
        params = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
        params.setdefault("partial_rotary_factor", mla.rope_dim / head_dim)
        rope = RopeSpec.from_config({**config, "rope_parameters": params, "rope_scaling": None}, head_dim)
    if rope.rotary_dim != mla.rope_dim:
        raise ModelLoadError(
            f"{origin}: the RoPE parameters rotate {rope.rotary_dim} dims per head but qk_rope_head_dim is "
            f"{mla.rope_dim}; fix head_dim or partial_rotary_factor"
        )
    return rope


def _router_spec(config: dict[str, Any], family: Family, num_experts: int, origin: str) -> RouterSpec:
    """DeepSeek-V3: sigmoid scoring (+ correction bias); Mistral 4: softmax. Both: groups, top-k
    renormalisation (``norm_topk_prob``) and ``routed_scaling_factor``."""
    scaling = float(config.get("routed_scaling_factor", 1.0))
    if not math.isfinite(scaling) or scaling <= 0:
        raise ModelLoadError(f"{origin}: routed_scaling_factor must be a positive number, got {scaling}")
    try:
        return RouterSpec(
            num_experts=num_experts,
            top_k=int(require(config, "num_experts_per_tok", origin)),
            scoring="sigmoid" if family == "deepseek_v3" else "softmax",
            normalize_top_k=bool(config.get("norm_topk_prob", True)),
            num_groups=int(config.get("n_group") or 1),
            top_k_groups=int(config.get("topk_group") or 1),
            routed_scaling_factor=scaling,
        )
    except ValueError as exc:
        raise ModelLoadError(f"{origin}: {exc}") from exc
