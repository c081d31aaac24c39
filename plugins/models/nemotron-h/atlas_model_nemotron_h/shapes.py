"""The tensors a Nemotron-H checkpoint holds, by name and shape (what `NemotronHLoader.build` reads),
for building the model from random weights.

Weights are described under ``backbone.`` (NVIDIA's checkpoints) with routed experts stacked
(``experts.up_proj [E, I, W]``, ``experts.down_proj [E, W, I]``), a layout the loader reads like the
per-expert one.
"""

from __future__ import annotations

from typing import Any

from atlas_core.model.layers.moe import fused_expert_shapes
from atlas_model_nemotron_h.config import NemotronHSpec

Shapes = dict[str, tuple[int, ...]]
PREFIX = "backbone."


def checkpoint_shapes(config: dict[str, Any]) -> Shapes:
    """Tensor name -> shape of every tensor the loader reads from a checkpoint with this ``config``."""
    spec = NemotronHSpec.from_config(config)
    hidden = spec.hidden_size
    shapes: Shapes = {PREFIX + "embeddings.weight": (spec.vocab_size, hidden), PREFIX + "norm_f.weight": (hidden,)}
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, hidden)
    for i, kind in enumerate(spec.layer_kinds):
        p = f"{PREFIX}layers.{i}."
        shapes[p + "norm.weight"] = (hidden,)
        if kind == "mamba":
            shapes |= mamba_shapes(p + "mixer.", spec)
        elif kind == "attention":
            shapes |= attention_shapes(p + "mixer.", spec)
        elif kind == "mlp":
            shapes |= relu2_mlp_shapes(p + "mixer.", hidden, spec.intermediate_size, spec.mlp_bias)
        else:
            shapes |= moe_shapes(p + "mixer.", spec)
    return shapes


def mamba_shapes(prefix: str, spec: NemotronHSpec) -> Shapes:
    """One Mamba-2 mixer: input projection, convolution, SSM parameters, gated norm, output projection."""
    shape, hidden = spec.mamba, spec.hidden_size
    shapes: Shapes = {
        "in_proj.weight": (shape.in_proj_size, hidden),
        "conv1d.weight": (shape.conv_dim, 1, shape.conv_kernel),
        "A_log": (shape.num_heads,),
        "D": (shape.num_heads,),
        "dt_bias": (shape.num_heads,),
        "norm.weight": (shape.inner_size,),
        "out_proj.weight": (hidden, shape.inner_size),
    }
    if spec.mamba_bias:
        shapes |= {"in_proj.bias": (shape.in_proj_size,), "out_proj.bias": (hidden,)}
    if spec.conv_bias:
        shapes["conv1d.bias"] = (shape.conv_dim,)
    return {prefix + name: value for name, value in shapes.items()}


def attention_shapes(prefix: str, spec: NemotronHSpec) -> Shapes:
    """Attention without biases, norms or RoPE."""
    hidden, q_rows, kv_rows = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return {
        prefix + "q_proj.weight": (q_rows, hidden),
        prefix + "k_proj.weight": (kv_rows, hidden),
        prefix + "v_proj.weight": (kv_rows, hidden),
        prefix + "o_proj.weight": (hidden, q_rows),
    }


def relu2_mlp_shapes(prefix: str, hidden: int, inter: int, bias: bool) -> Shapes:
    """A squared-ReLU MLP: ``up_proj [inter, hidden]``, ``down_proj [hidden, inter]``, biases when ``bias``."""
    shapes: Shapes = {prefix + "up_proj.weight": (inter, hidden), prefix + "down_proj.weight": (hidden, inter)}
    if bias:
        shapes |= {prefix + "up_proj.bias": (inter,), prefix + "down_proj.bias": (hidden,)}
    return shapes


def moe_shapes(prefix: str, spec: NemotronHSpec) -> Shapes:
    """Router with correction bias, non-gated routed experts (in the latent width when there is one,
    with its two projections), and the shared expert."""
    moe, hidden = spec.moe, spec.hidden_size
    assert moe is not None  # a config with MoE layers has MoE settings
    experts = moe.router.num_experts
    width = hidden if moe.latent_size is None else moe.latent_size
    shapes: Shapes = {
        prefix + "gate.weight": (experts, hidden),
        prefix + "gate.e_score_correction_bias": (experts,),
        **fused_expert_shapes(prefix + "experts.", experts, moe.intermediate_size, width, gated=False),
        **relu2_mlp_shapes(prefix + "shared_experts.", hidden, moe.shared_intermediate_size, spec.mlp_bias),
    }
    if moe.latent_size is not None:
        shapes |= {
            prefix + "fc1_latent_proj.weight": (width, hidden),
            prefix + "fc2_latent_proj.weight": (hidden, width),
        }
        if spec.mlp_bias:
            shapes |= {prefix + "fc1_latent_proj.bias": (width,), prefix + "fc2_latent_proj.bias": (hidden,)}
    return shapes
