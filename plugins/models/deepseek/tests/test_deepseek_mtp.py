"""DeepSeek-V3's multi-token-prediction layer (``model.layers.{num_hidden_layers}``) as a speculative-decoding
proposer on the tiny checkpoints: the head's logits match ``mtp_reference.npz`` (transformers' modules
assembled per the published architecture, ``scripts/make_mtp_fixtures.py``), greedy output is plain
decoding's alone and batched, nothing is left held, and the tensors described for random weights are
those ``build_mtp`` reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from atlas_model_deepseek.loader import DeepseekV3Loader, Mistral3Loader, Mistral4Loader
from safetensors import safe_open

from atlas_core import LLM, SamplingParams
from atlas_core.batch.kv_cache import LatentKVLayout
from atlas_core.bench.random_weights import random_weights_llm
from atlas_core.errors import ConfigError
from atlas_core.model.layers.mla import MultiHeadLatentAttention
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import GREEDY, assert_no_leaks, mixed_prompts
from atlas_core.testing.mtp import MTP_CONFIG, assert_mtp_head_matches_reference, mtp_head

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
WITH_MTP = ("deepseek_v3", "deepseek_v3_no_q_lora")
MTP_K2 = {"method": "mtp", "num_speculative_tokens": 2}


@pytest.mark.parametrize("name", WITH_MTP)
def test_mtp_head_logits_match_the_reference(name: str) -> None:
    """Row ``p``: the target's normed hidden state at ``p`` and token ``p + 1`` through ``enorm`` /
    ``hnorm``, ``eh_proj``, the MLA + MoE layer, ``shared_head`` -> log-probabilities of token ``p + 2``."""
    assert_mtp_head_matches_reference(TINY / name)


@pytest.mark.parametrize("name", WITH_MTP)
def test_mtp_layer_after_the_targets_layers(name: str) -> None:
    """The MTP layer is an MLA + MoE decoder layer whose latent KV follows the target's layers in its cache;
    the target keeps its own layers only. The layer's embedding and LM head are the target's unless they
    differ: ``deepseek_v3`` stores copies of them (shared), ``deepseek_v3_no_q_lora`` an own LM head."""
    llm = LLM(TINY / name, speculative_config=MTP_K2)
    target, head = llm.loaded.model, mtp_head(llm)
    assert len(target.layers) == TINY.config(name)["num_hidden_layers"]
    assert len(head.layers) == 1 and head.kv_layouts == [LatentKVLayout(32, 8)]
    mtp = head.layers[0]
    assert mtp.norm_in_logits
    mixer = mtp.layer.mixer
    assert isinstance(mixer, MultiHeadLatentAttention) and mixer.layer_index == len(target.kv_layouts)
    assert isinstance(mtp.layer.ffn, MoEFeedForward) and mtp.layer.ffn.correction_bias is not None
    assert mtp.embed_tokens is None
    assert (mtp.lm_head is None) == (name == "deepseek_v3")


@pytest.mark.parametrize("name", WITH_MTP)
def test_mtp_greedy_equals_plain_alone_and_batched(name: str) -> None:
    """Two MTP drafts a step (chained through the layer's un-normed output), verified and, with random
    weights, rejected: the tokens equal plain decoding's, for prompts alone and batched with prefix-cache
    hits and small blocks (the chain stops at the sequence's last block); nothing is left held."""
    plain = LLM(TINY / name, enable_prefix_caching=False)
    prompts = mixed_prompts(plain.loaded.model.vocab_size, count=5, max_tail_length=30)
    want = [output.outputs[0].token_ids for output in plain.generate(prompts, GREEDY)]
    spec = LLM(TINY / name, speculative_config=MTP_K2, enable_prefix_caching=False)
    assert [spec.generate(prompt, GREEDY)[0].outputs[0].token_ids for prompt in prompts[:2]] == want[:2]
    batched = LLM(TINY / name, speculative_config=MTP_K2, block_size=4)
    for _ in range(2):  # the second run hits the prefix cache the first filled
        assert [output.outputs[0].token_ids for output in batched.generate(prompts, GREEDY)] == want
        assert_no_leaks(batched)
    for llm in (spec, batched):
        assert llm.engine.runner.spec_stats.proposed > 0
        assert_no_leaks(llm)
        speculation = llm.engine.speculation
        assert speculation is not None and speculation.proposer.tracked_sequences == 0  # type: ignore[attr-defined]


def test_mtp_checkpoint_shapes_are_what_build_mtp_reads() -> None:
    """`mtp_checkpoint_shapes` (random-weights benchmarks) describes the MTP layer's tensors but its copies of
    the embedding and LM head (the target's serve), and a random-weights model of the shape speculates."""
    name = "deepseek_v3"
    prefix = "model.layers.3."
    with safe_open(str(TINY / name / "model.safetensors"), "np") as checkpoint:
        stored = {key: tuple(checkpoint.get_slice(key).get_shape()) for key in checkpoint.keys()}
    stored = {k: v for k, v in stored.items() if k.startswith(prefix) and ".experts." not in k}
    described = DeepseekV3Loader.mtp_checkpoint_shapes(TINY.config(name))
    fused = {k for k in described if ".experts." in k}
    assert fused  # routed experts described fused, stored per expert (the loader reads both)
    tables = {prefix + "embed_tokens.weight", prefix + "shared_head.head.weight"}
    assert {k: v for k, v in described.items() if k not in fused} == {
        k: v for k, v in stored.items() if k not in tables
    }

    llm = random_weights_llm(
        str(TINY / name), backend="numpy", kv_cache_memory_gib=1 / 16, max_seq_len=64, speculative_config=MTP_CONFIG
    )
    out = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 6 and llm.engine.runner.spec_stats.proposed > 0
    assert mtp_head(llm).layers[0].lm_head is None


def test_mtp_refused_without_mtp_layers() -> None:
    """Mistral Small 4 checkpoints (causal LM and vision-language) have no MTP layers: method ``mtp`` is
    refused, naming the alternatives, and none are described for random weights."""
    for name in ("mistral4", "mistral4_vl"):
        with pytest.raises(ConfigError, match="mistral4 checkpoint has none; use method 'ngram' or 'draft_model'"):
            LLM(TINY / name, speculative_config=MTP_CONFIG)
        loader = Mistral4Loader if name == "mistral4" else Mistral3Loader
        assert loader.mtp_checkpoint_shapes(TINY.config(name)) == {}
