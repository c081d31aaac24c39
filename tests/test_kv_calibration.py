"""fp8 KV-cache scales measured on text (`atlas_core.engine.kv_calibration`, ``atlas calibrate-kv``) and applied
by ``kv_cache_scales`` (``--kv-cache-scales``), on the NumPy backend with the tiny checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.backends.kv_dtypes import FP8_E4M3_MAX
from atlas_core.cli import main
from atlas_core.engine.kv_calibration import (
    CALIBRATION_TEXT,
    KV_SCALE_HEADROOM,
    measure_kv_scales,
    read_kv_scales,
    write_kv_scales,
)
from atlas_core.errors import ConfigError
from atlas_core.testing.family import mixed_prompts
from atlas_core.testing.parity import full_prompt_logprobs
from tests.conftest import TINY


def test_scales_map_the_largest_stored_magnitude_below_e4m3s_top(tmp_path: Path) -> None:
    """Each layer's scale is its cache's largest magnitude times the headroom over 448; an fp8 cache with those
    scales then stores the calibration prompt's keys and values at most at half of E4M3's range, never saturated."""
    llm = LLM(TINY / "llama", kv_cache_memory_gib=1 / 64)
    prompt = mixed_prompts(llm.loaded.model.vocab_size, count=1)[0]
    scales = measure_kv_scales(llm, [prompt])
    assert len(scales) == len(llm.engine.kv.keys)
    for (k_scale, v_scale), keys, values in zip(scales, llm.engine.kv.keys, llm.engine.kv.values, strict=True):
        for scale, cache in ((k_scale, keys), (v_scale, values)):
            amax = float(np.abs(cache).max())
            assert amax > 0 and scale == pytest.approx(amax * KV_SCALE_HEADROOM / FP8_E4M3_MAX, rel=1e-6)
    path = tmp_path / "scales.json"
    write_kv_scales(path, scales, "llama")
    fp8 = LLM(TINY / "llama", kv_cache_memory_gib=1 / 64, kv_cache_dtype="fp8", kv_cache_scales=str(path))
    fp8.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    for cache in (*fp8.engine.kv.keys, *fp8.engine.kv.values):
        stored = float(np.abs(cache.astype(np.float32)).max())
        assert 0 < stored <= FP8_E4M3_MAX / KV_SCALE_HEADROOM * 1.07  # E4M3 rounds up by at most 1/16


def with_word_tokenizer(tmp_path: Path, name: str) -> Path:
    """A copy of tiny checkpoint ``name`` with a word-level tokenizer over the calibration text's first words."""
    from tokenizers import pre_tokenizers

    words = list(dict.fromkeys(word for word, _ in pre_tokenizers.Whitespace().pre_tokenize_str(CALIBRATION_TEXT)))
    return TINY.with_word_tokenizer(tmp_path / "with_tokenizer", name, words[: TINY.config(name)["vocab_size"] - 1])


def test_calibrate_kv_command_writes_scales_that_kv_cache_scales_applies(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``atlas calibrate-kv`` writes a file; an engine given it stores fp8 with those scales, on every layer, and
    stays as close to the default cache as the fp8 bounds of test_kv_cache_dtype."""
    path, folder = tmp_path / "scales.json", with_word_tokenizer(tmp_path, "qwen3")
    assert main(["calibrate-kv", str(folder), "--backend", "numpy", "--output", str(path)]) == 0
    assert "use it with --kv-cache-dtype fp8 --kv-cache-scales" in capsys.readouterr().out
    base = LLM(folder)
    scales = read_kv_scales(path, len(base.engine.kv.keys))
    calibrated = LLM(folder, kv_cache_dtype="fp8", kv_cache_scales=str(path))
    assert calibrated.engine.kv.scales == scales and all(s != (1.0, 1.0) for s in scales)
    prompt = mixed_prompts(base.loaded.model.vocab_size, count=1)[0]
    rows, ids = np.arange(len(prompt) - 1), np.asarray(prompt[1:])
    diff = np.abs(full_prompt_logprobs(calibrated, prompt)[rows, ids] - full_prompt_logprobs(base, prompt)[rows, ids])
    assert 0 < float(np.median(diff)) <= 0.05 and float(diff.max()) <= 0.3


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not json", r"cannot be read as JSON .* write one with `atlas calibrate-kv`"),
        ('{"layers": []}', r"is not a atlas-kv-scales/1 file"),
        (
            '{"format": "atlas-kv-scales/1", "model": "other", "layers": [{"k_scale": 1, "v_scale": 1}]}',
            r"has 1 layers but this model has 3 KV layers \(it was written for 'other'\)",
        ),
        (
            '{"format": "atlas-kv-scales/1", "layers": [{"k_scale": 1, "v_scale": 1}, {"k_scale": -2}, {}]}',
            r"layer 1 needs positive finite 'k_scale' and 'v_scale'",
        ),
    ],
)
def test_a_bad_scales_file_is_refused_naming_it(tmp_path: Path, document: str, message: str) -> None:
    path = tmp_path / "scales.json"
    path.write_text(document)
    with pytest.raises(ConfigError, match=message) as caught:
        read_kv_scales(path, 3)
    assert str(path) in str(caught.value)


def test_a_scales_file_covers_the_model_layers_and_mtp_layers_keep_theirs(tmp_path: Path) -> None:
    """A file calibrated without speculation applies with MTP speculation on: the MTP layer keeps its own scales."""
    own = len(LLM(TINY / "qwen3_next", kv_cache_memory_gib=1 / 64).engine.kv.keys)
    path = tmp_path / "scales.json"
    write_kv_scales(path, [(0.5, 0.25)] * own, "qwen3_next")
    mtp = {"method": "mtp", "num_speculative_tokens": 1}
    llm = LLM(TINY / "qwen3_next", kv_cache_dtype="fp8", kv_cache_scales=str(path), speculative_config=mtp)
    assert len(llm.engine.kv.scales) == own + 1
    assert llm.engine.kv.scales[:own] == [(0.5, 0.25)] * own and llm.engine.kv.scales[own] == (1.0, 1.0)


def test_scales_need_fp8_and_a_file_of_this_model(tmp_path: Path) -> None:
    path = tmp_path / "scales.json"
    write_kv_scales(path, [(0.5, 0.25)] * 7, "seven-layer model")
    assert json.loads(path.read_text())["model"] == "seven-layer model"
    with pytest.raises(ConfigError, match="kv_cache_scales applies to kv_cache_dtype=fp8, not auto: set"):
        LLM(TINY / "llama", kv_cache_scales=str(path))
    with pytest.raises(ConfigError, match="has 7 layers but this model has"):
        LLM(TINY / "llama", kv_cache_dtype="fp8", kv_cache_scales=str(path))
