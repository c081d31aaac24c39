"""Mixture-of-Experts fixtures: qwen3_moe (softmax routing, dense layers beside MoE layers) and minimax_m2
(sigmoid routing with a selection-only correction bias, full-width q/k norms, partial rotary).

Every MoE layer has 8 experts and routes each token to 2, so different tokens use different experts.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from tiny_checkpoint_specs import Spec
from transformers import MiniMaxM2Config, Qwen3MoeConfig

MOE: dict[str, Any] = {"num_experts_per_tok": 2, "tie_word_embeddings": False}
CORRECTION_BIAS_STD = 0.15
"""Comparable to the spread of the tiny routers' sigmoid scores, so the bias changes which experts win."""


class MiniMaxM2ForCausalLM(transformers.MiniMaxM2ForCausalLM):
    """MiniMax-M2 whose ``e_score_correction_bias`` buffers (zeros in transformers, and not parameters, so the
    generator's ``init`` hook never sees them) are drawn from the seeded global generator. The class name
    is transformers' own, so the saved config names the real architecture; on reload the saved buffers
    replace the draw."""

    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for layer in self.model.layers:
                layer.mlp.e_score_correction_bias.normal_(0.0, CORRECTION_BIAS_STD)


SPECS: list[Spec] = [
    Spec(
        name="qwen3_moe",
        config_cls=Qwen3MoeConfig,
        config_kwargs={
            **MOE, "num_hidden_layers": 3, "num_experts": 8, "moe_intermediate_size": 32, "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
        seed=3001,
        description=(
            "Qwen3-MoE: per-head q/k norms, 3 layers; layers 0 and 2 are MoE (8 experts, top-2, softmax, "
            "renormalised: norm_topk_prob), layer 1 a dense MLP (mlp_only_layers); experts saved per expert "
            "(mlp.experts.{e}.gate_proj/up_proj/down_proj)."
        ),
    ),
    Spec(
        name="qwen3_moe_sparse_step",
        config_cls=Qwen3MoeConfig,
        config_kwargs={
            **MOE, "num_hidden_layers": 4, "num_experts": 8, "moe_intermediate_size": 32, "norm_topk_prob": False,
            "decoder_sparse_step": 2,
        },
        seed=3002,
        description=(
            "Qwen3-MoE with decoder_sparse_step 2 (layers 1 and 3 MoE, 0 and 2 dense) and norm_topk_prob off: "
            "the top-2 softmax probabilities are used as they are."
        ),
    ),
    Spec(
        name="minimax_m2",
        config_cls=MiniMaxM2Config,
        config_kwargs={
            **MOE, "num_hidden_layers": 2, "num_local_experts": 8, "intermediate_size": 32, "rotary_dim": 8,
            "bos_token_id": 1, "eos_token_id": 2,
        },
        seed=3003,
        model_cls=MiniMaxM2ForCausalLM,
        description=(
            "MiniMax-M2: RMSNorm over all heads' q (and k) at once, partial rotary (rotary_dim 8 of head_dim 16), "
            "8 experts (w1/w3/w2), top-2 by sigmoid score + e_score_correction_bias (perturbed, std 0.15: it "
            "changes the selection), weights renormalised without the bias."
        ),
    ),
]
