"""Nemotron-H hybrids: Mamba-2, attention without RoPE, squared-ReLU MLP and MoE layers in one stack.

Both fixtures have two Mamba-2 layers (their states must stay apart), a scan chunk of 16 tokens (the
19- and 40-token prompts cross chunk boundaries), 8 SSM heads over 2 groups, and a MoE with sigmoid
routing and a random score-correction bias. ``nemotron_h_latent`` adds what larger Nemotron 3 models
use: group-limited routing, latent expert projections, and biases on every projection.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from tiny_checkpoint_specs import Spec
from transformers import NemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter

CORRECTION_BIAS_STD = 0.1

MAMBA: dict[str, Any] = {
    "mamba_num_heads": 8,
    "mamba_head_dim": 8,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "chunk_size": 16,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False,
}
MOE: dict[str, Any] = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 48,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
}


class NemotronHWithCorrectionBias:
    """Stands in for ``model_cls``: builds transformers' own ``NemotronHForCausalLM`` with a random router
    ``e_score_correction_bias`` (a buffer, which the generator's re-initialisation of parameters would
    leave at zero, and a zero bias cannot catch an engine that ignores it), and loads it unchanged.

    Not a subclass on purpose: transformers finds the checkpoint conversion (``backbone.`` names,
    per-expert tensors: the layout NVIDIA publishes) by the model's class, and saves a subclass in its
    in-memory layout instead."""

    from_pretrained = transformers.NemotronHForCausalLM.from_pretrained

    @staticmethod
    def _from_config(config: NemotronHConfig, **kwargs: Any) -> transformers.NemotronHForCausalLM:
        model = transformers.NemotronHForCausalLM._from_config(config, **kwargs)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, NemotronHTopkRouter):
                    bias = module.e_score_correction_bias
                    bias.copy_(CORRECTION_BIAS_STD * torch.randn(bias.shape))
        return model


def init_mamba(name: str, param: torch.Tensor, noise: torch.Tensor) -> torch.Tensor | None:
    """Spread the Mamba-2 scalars away from transformers' constants: ``A = -exp(A_log)`` around -0.4
    (a slow enough decay that state carries across chunks), ``dt_bias`` and ``D`` per head, and a
    larger convolution so its taps matter. Everything else takes the default rule."""
    if name.endswith("mixer.A_log"):
        return -1.0 + 0.5 * noise
    if name.endswith("mixer.dt_bias"):
        return 0.5 * noise
    if name.endswith("mixer.D"):
        return 1.0 + 0.5 * noise
    if name.endswith("conv1d.weight"):
        return 0.3 * noise
    return None


SPECS: list[Spec] = [
    Spec(
        name="nemotron_h",
        config_cls=NemotronHConfig,
        config_kwargs={**MAMBA, **MOE, "hybrid_override_pattern": "ME*M-", "n_group": 1, "topk_group": 1},
        seed=3001,
        model_cls=NemotronHWithCorrectionBias,
        init=init_mamba,
        description=(
            "Nemotron-H, 5 layers: Mamba-2, MoE, attention (no RoPE, GQA 4/2), Mamba-2, squared-ReLU MLP. "
            "Mamba-2: 8 heads of 8, 2 groups, state 16, conv 4, chunk 16; MoE: 8 experts, top-2, sigmoid "
            "routing with correction bias, renormalised, routed scaling 2.5, shared expert."
        ),
    ),
    Spec(
        name="nemotron_h_latent",
        config_cls=NemotronHConfig,
        config_kwargs={
            **MAMBA, **MOE, "hybrid_override_pattern": "M*EM", "n_group": 2, "topk_group": 1, "moe_latent_size": 32,
            "mlp_bias": True, "use_bias": True,
        },
        seed=3002,
        model_cls=NemotronHWithCorrectionBias,
        init=init_mamba,
        description=(
            "Nemotron-H, 4 layers: Mamba-2, attention, MoE, Mamba-2; group-limited routing (2 groups, best 1), "
            "experts in a 32-wide latent space (fc1/fc2 latent projections), biases on in_proj/out_proj and "
            "every MLP projection."
        ),
    ),
]
