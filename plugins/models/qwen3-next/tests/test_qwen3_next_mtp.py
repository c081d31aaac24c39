"""The ``mtp.*`` multi-token-prediction layers of Qwen3-Next and Qwen3.5-MoE tiny checkpoints: the MTP
head's logits over every prompt position match ``mtp_reference.npz``, which transformers' own modules
computed for the published architecture (``scripts/make_mtp_fixtures.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atlas_core import SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.mtp import MTP_CONFIG, assert_mtp_head_matches_reference

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_mtp_head_logits_match_the_reference(name: str) -> None:
    """After each prefill chunk the MTP layer runs over its positions ``p`` (the target's hidden state
    there and token ``p + 1``): its log-probabilities for tokens ``p + 2``."""
    assert_mtp_head_matches_reference(TINY / name)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_mtp_checkpoint_shapes_are_what_build_mtp_reads(name: str) -> None:
    """`mtp_checkpoint_shapes` (random-weights benchmarks) describes exactly the ``mtp.*`` tensors, and a
    random-weights model of the shape speculates with them."""
    from atlas_model_qwen3_next.loader import Qwen3NextLoader
    from safetensors import safe_open

    config = TINY.config(name)
    with safe_open(str(TINY / name / "model.safetensors"), "np") as checkpoint:
        stored = {
            key: tuple(checkpoint.get_slice(key).get_shape()) for key in checkpoint.keys() if key.startswith("mtp.")
        }
    described = Qwen3NextLoader.mtp_checkpoint_shapes(config)
    fused = {key for key in described if ".experts.gate_up_proj" in key or ".experts.down_proj" in key}
    assert {k: v for k, v in described.items() if k not in fused} == {
        k: v for k, v in stored.items() if ".experts." not in k
    }
    assert fused  # routed experts described fused, stored per expert (the loader reads both)

    from atlas_core.bench.random_weights import random_weights_llm

    llm = random_weights_llm(
        str(TINY / name), backend="numpy", kv_cache_memory_gib=1 / 16, max_seq_len=64, speculative_config=MTP_CONFIG
    )
    out = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 6 and llm.engine.runner.spec_stats.proposed > 0
