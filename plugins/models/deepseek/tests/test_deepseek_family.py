"""atlas-model-deepseek: registration, layer composition, the latent KV cache, sensitivity of the parity
references to each DeepSeek / Mistral 4 detail, engine invariants and bad configs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.batch.kv_cache import KVCacheTooSmallError, LatentKVLayout
from atlas_core.errors import ModelLoadError, UnsupportedArchitectureError
from atlas_core.model.layers.mla import MultiHeadLatentAttention
from atlas_core.model.layers.mlp import SwiGLUMLP
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.cli import run_plugins
from atlas_core.testing.family import (
    GREEDY,
    INVARIANCE_SETTINGS,
    assert_batch_invariant,
    assert_no_leaks,
    greedy_alone,
    mixed_prompts,
)
from atlas_core.testing.parity import TOLERANCE, ReferenceParity, max_prompt_logprob_error

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
FIXTURES = ("deepseek_v3", "deepseek_v3_no_q_lora", "mistral4", "mistral4_vl")


def test_registers_the_families_with_serving_defaults() -> None:
    registry = load_plugins()
    expected = {
        "deepseek_v3": {"reasoning_parser": "deepseek_r1", "tool_call_parser": "deepseek_v3"},
        "mistral4": {"reasoning_parser": "mistral", "tool_call_parser": "mistral"},
        "mistral3": {"reasoning_parser": "mistral", "tool_call_parser": "mistral"},
    }
    for model_type, defaults in expected.items():
        registration = registry.get("model", model_type)
        assert registration.plugin.distribution == "atlas-model-deepseek"
        assert registration.metadata["defaults"] == defaults
    assert LLM(TINY / "mistral4_vl").loaded.family_defaults == expected["mistral3"]


def test_atlas_plugins_lists_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_plugins(capsys).splitlines()
    assert "deepseek  atlas-model-deepseek 0.1.0" in lines
    for model_type, loader in (
        ("deepseek_v3", "DeepseekV3Loader"),
        ("mistral4", "Mistral4Loader"),
        ("mistral3", "Mistral3Loader"),
    ):
        assert any(line.startswith(f"  model {model_type} -> atlas_model_deepseek.loader:{loader} (") for line in lines)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_layers_are_mla_with_dense_first_layers_then_moe(fixture: str) -> None:
    llm = LLM(TINY / fixture)
    model = llm.loaded.model
    assert all(isinstance(layer.mixer, MultiHeadLatentAttention) for layer in model.layers)
    assert isinstance(model.layers[0].ffn, SwiGLUMLP)
    moe = [layer.ffn for layer in model.layers[1:]]
    assert moe and all(isinstance(block, MoEFeedForward) and block.shared_expert is not None for block in moe)
    spec = moe[0].spec
    deepseek = fixture.startswith("deepseek")
    assert spec.scoring == ("sigmoid" if deepseek else "softmax")
    assert all((block.correction_bias is not None) == deepseek for block in moe)
    assert model.kv_layouts == [LatentKVLayout(32, 8)] * len(model.layers)
    mixer = model.layers[0].mixer
    assert (mixer.weights.q_b is None) == (fixture == "deepseek_v3_no_q_lora")
    assert (mixer.position_scale is None) == deepseek


def test_latent_cache_holds_one_latent_row_per_token() -> None:
    """Per layer one ``[blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]`` array and no values:
    (32 + 8) * 4 bytes per token and layer instead of 2 * 4 heads * 24 * 4 for expanded K/V."""
    llm = LLM(TINY / "deepseek_v3", block_size=8)
    kv = llm.engine.kv
    assert all(keys.shape == (kv.num_blocks, 8, 1, 40) for keys in kv.keys)
    assert kv.values == [None, None, None]
    assert llm.engine.kv_plan.bytes_per_token == 3 * 40 * 4


def test_kv_sizing_error_counts_the_latent_bytes() -> None:
    with pytest.raises(KVCacheTooSmallError) as excinfo:
        LLM(TINY / "deepseek_v3", kv_cache_memory_gib=1e-5, max_seq_len=512, block_size=16)
    message = str(excinfo.value)
    assert "(480 bytes per token over 3 layers: 3 x MLA latent 32+8)" in message
    assert "holds 1 blocks" in message and "needs 32 blocks" in message and "Lower max_seq_len to at most 16" in message


def _drop_correction_bias(llm: LLM) -> None:
    for layer in llm.loaded.model.layers[1:]:
        layer.ffn.correction_bias = None


def _drop_position_scale(llm: LLM) -> None:
    for layer in llm.loaded.model.layers:
        layer.mixer.position_scale = None


def _plain_softmax_scale(llm: LLM) -> None:
    for layer in llm.loaded.model.layers:
        layer.mixer.scale = (layer.mixer.shape.nope_dim + layer.mixer.shape.rope_dim) ** -0.5


@pytest.mark.parametrize(
    ("fixture", "alteration"),
    [
        ("deepseek_v3", _drop_correction_bias),
        ("deepseek_v3", _plain_softmax_scale),
        ("mistral4", _drop_position_scale),
        ("mistral4", _plain_softmax_scale),
    ],
    ids=["correction-bias", "deepseek-mscale", "llama4-query-scale", "mistral4-mscale"],
)
def test_reference_catches_each_detail(fixture: str, alteration: Callable[[LLM], None]) -> None:
    """Each detail the family adds moves the log-probs far beyond the parity tolerance when left out."""
    llm = LLM(TINY / fixture)
    assert max_prompt_logprob_error(llm, TINY.reference(fixture)) <= TOLERANCE
    alteration(llm)
    assert max_prompt_logprob_error(llm, TINY.reference(fixture)) > 10 * TOLERANCE


@pytest.mark.parametrize("fixture", ["deepseek_v3", "mistral4"])
def test_chunked_prefill_prompt_logprobs_match_transformers(fixture: str) -> None:
    """Prompts prefilled 5 tokens per step (each chunk attends to the latents earlier chunks cached)
    give every prompt position's log-prob of the transformers reference."""
    llm = LLM(TINY / fixture, max_num_batched_tokens=5, enable_prefix_caching=False)
    ref = TINY.reference(fixture)
    for i in (2, 3):
        prompt = ref[f"prompt_{i}"].tolist()
        output = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
        for position in range(1, len(prompt)):
            got = output.prompt_logprobs[position][prompt[position]].logprob
            assert got == pytest.approx(ref[f"logprobs_{i}"][position - 1, prompt[position]], abs=TOLERANCE)


@pytest.fixture(scope="module", params=["deepseek_v3", "mistral4"])
def family_alone(request: pytest.FixtureRequest) -> tuple[str, list[list[int]]]:
    return request.param, greedy_alone(TINY / request.param)


@pytest.mark.parametrize("settings", list(INVARIANCE_SETTINGS.values()), ids=list(INVARIANCE_SETTINGS))
def test_greedy_tokens_are_batch_invariant(family_alone: tuple[str, list[list[int]]], settings: dict) -> None:
    fixture, alone = family_alone
    assert_batch_invariant(TINY / fixture, alone, settings)


def test_preemption_and_forks_keep_outputs(family_alone: tuple[str, list[list[int]]]) -> None:
    """A latent cache too small for the batch forces recompute; n > 1 forks share and copy latent blocks."""
    fixture, alone = family_alone
    layers = json.loads((TINY / fixture / "config.json").read_text())["num_hidden_layers"]
    budget_gib = 170 * layers * 40 * 4 / 2**30  # about 170 tokens of latent cache
    llm = LLM(TINY / fixture, block_size=4, max_seq_len=160, kv_cache_memory_gib=budget_gib)
    prompts = mixed_prompts(llm.loaded.model.vocab_size, count=len(alone))
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == alone
    assert_no_leaks(llm)
    forks = llm.generate(prompts[1], SamplingParams(n=3, temperature=0, max_tokens=12, ignore_eos=True))[0].outputs
    assert [completion.token_ids for completion in forks] == [alone[1]] * 3
    assert_no_leaks(llm)


def test_mistral3_with_another_text_model_is_refused(tmp_path: Path) -> None:
    folder = TINY.edited_copy(tmp_path, "mistral4_vl", edit=lambda c: c["text_config"].update(model_type="mistral"))
    with pytest.raises(UnsupportedArchitectureError, match="text_config.model_type is 'mistral'"):
        LLM(folder)


def test_unsupported_quantization_methods_are_refused(tmp_path: Path) -> None:
    """FP8 checkpoints load (tests/test_deepseek_fp8.py); other methods fail naming the method, the file and
    what is supported."""
    folder = TINY.edited_copy(tmp_path, "deepseek_v3", {"quantization_config": {"quant_method": "awq", "bits": 4}})
    expected = (
        "config.json: quantization_config.quant_method 'awq' is not supported; supported: 'fp8'.*'compressed-tensors'"
    )
    with pytest.raises(ModelLoadError, match=expected):
        LLM(folder)


def test_rope_dims_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    folder = TINY.edited_copy(
        tmp_path, "mistral4", edit=lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5)
    )
    with pytest.raises(ModelLoadError, match="rotate 12 dims per head but qk_rope_head_dim is 8"):
        LLM(folder)


class TestReferenceParity(ReferenceParity):
    """Every checkpoint of this family against its transformers reference."""

    checkpoints = TINY
