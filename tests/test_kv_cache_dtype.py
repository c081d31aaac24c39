"""The ``kv_cache_dtype`` setting: fp8 (E4M3 with per-layer scales) and bf16 KV on the NumPy backend.

Tolerances: |log p| of each prompt token against the float32 cache, 6 `mixed_prompts` per tiny checkpoint;
the median over prompts of the per-prompt median, and the max. Measured (fp8 / bf16 median, max): llama
0.024 / 0.0015, 0.14 / 0.007; qwen3 0.022 / 0.0016, 0.13 / 0.008; nemotron_h 0.0023 / 0.0002, 0.036 / 0.0016;
qwen3_next 0.015 / 0.0008, 1.03 / 0.089; gemma4 0.126 / 0.010, 1.71 / 0.26 (random tiny weights: the max
falls on tokens of tiny probability). `TOLERANCES` leaves about 2x headroom."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core import LLM
from atlas_core.backends.base import Backend
from atlas_core.backends.kv_dtypes import FP8_E4M3, dequantize_kv, quantize_kv
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.batch.kv_cache import KVCacheTooSmallError, KVLayout, LatentKVLayout, kv_storage_layouts, plan_kv_cache
from atlas_core.errors import ConfigError
from atlas_core.testing.family import assert_batch_invariant, greedy_alone, mixed_prompts
from atlas_core.testing.parity import full_prompt_logprobs
from tests.conftest import TINY

TOLERANCES = {
    ("llama", "fp8"): (0.05, 0.3),
    ("qwen3", "fp8"): (0.05, 0.3),
    ("nemotron_h", "fp8"): (0.005, 0.08),
    ("qwen3_next", "fp8"): (0.03, 2.0),
    ("gemma4", "fp8"): (0.25, 3.5),
    ("llama", "bf16"): (0.003, 0.015),
    ("qwen3", "bf16"): (0.003, 0.016),
    ("nemotron_h", "bf16"): (0.0005, 0.004),
    ("qwen3_next", "bf16"): (0.002, 0.18),
    ("gemma4", "bf16"): (0.02, 0.5),
}
"""(checkpoint, kv_cache_dtype) -> (median, max) |log p| difference to the default KV allowed."""


def test_quantize_divides_rounds_to_e4m3_and_saturates() -> None:
    x = np.array([0.0, 1.0, -3.0, 0.3, 1000.0, -1000.0], dtype=np.float32)
    stored = quantize_kv(x, FP8_E4M3, 2.0)
    assert stored.dtype == FP8_E4M3
    np.testing.assert_array_equal(dequantize_kv(stored, 2.0), [0.0, 1.0, -3.0, 0.3125, 896.0, -896.0])


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_next", "nemotron_h", "gemma4"])
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_logits_stay_close_to_the_default_kv(name: str, dtype: str) -> None:
    base, other = LLM(TINY / name), LLM(TINY / name, kv_cache_dtype=dtype)
    medians, worst = [], 0.0
    for prompt in mixed_prompts(base.loaded.model.vocab_size, count=6):
        rows, ids = np.arange(len(prompt) - 1), np.asarray(prompt[1:])
        diff = np.abs(full_prompt_logprobs(base, prompt)[rows, ids] - full_prompt_logprobs(other, prompt)[rows, ids])
        medians.append(float(np.median(diff)))
        worst = max(worst, float(diff.max()))
    median_bound, max_bound = TOLERANCES[name, dtype]
    assert float(np.median(medians)) <= median_bound and worst <= max_bound, (np.median(medians), worst)
    assert worst > 0  # the cache really is stored narrower


@pytest.mark.parametrize("model_name", ["llama", "qwen3"])
@pytest.mark.parametrize(
    "settings",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": True},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
    ],
    ids=["batched", "prefix-cache", "chunked-prefill"],
)
def test_greedy_tokens_are_batch_invariant_with_fp8_kv(model_name: str, settings: dict) -> None:
    alone = greedy_alone(TINY / model_name, count=8, kv_cache_dtype="fp8")
    assert_batch_invariant(TINY / model_name, alone, settings, kv_cache_dtype="fp8")


def test_sizing_counts_one_byte_per_fp8_element() -> None:
    fp32 = NumpyBackend.activation_dtype
    layouts = kv_storage_layouts([KVLayout(2, 16)] * 2, "fp8", NumpyBackend())
    assert [layout.dtype for layout in layouts] == [FP8_E4M3] * 2
    fp8_plan = plan_kv_cache(layouts, fp32, 16, 2**20, 64, "b")
    bf16_plan = plan_kv_cache(
        kv_storage_layouts([KVLayout(2, 16)] * 2, "bf16", NumpyBackend()), fp32, 16, 2**20, 64, "b"
    )
    fp32_plan = plan_kv_cache([KVLayout(2, 16)] * 2, fp32, 16, 2**20, 64, "b")
    assert fp8_plan.bytes_per_token == 2 * 2 * 2 * 16
    assert fp8_plan.capacity_tokens == 2 * bf16_plan.capacity_tokens == 4 * fp32_plan.capacity_tokens
    with pytest.raises(KVCacheTooSmallError, match=r"\(128 bytes per token over 2 layers\) with KV stored as float8"):
        plan_kv_cache(layouts, fp32, 4, 0, 8, "b")


def test_engine_and_ready_line_report_the_kv_dtype() -> None:
    llm = LLM(TINY / "qwen3", kv_cache_dtype="fp8", kv_cache_memory_gib=1 / 64)
    default = LLM(TINY / "qwen3", kv_cache_memory_gib=1 / 64)
    assert (llm.engine.kv_dtype, default.engine.kv_dtype) == ("float8_e4m3fn", "float32")
    assert llm.engine.kv_capacity_tokens == 4 * default.engine.kv_capacity_tokens
    assert all(k.dtype == FP8_E4M3 for k in llm.engine.kv.keys) and llm.engine.kv.scales[0] == (1.0, 1.0)


def test_high_precision_layers_keep_the_activation_dtype() -> None:
    """``kv_high_precision_layers``: the named KV layers stay unscaled in the activation dtype, the others fp8; the
    sizing counts both, and the logits move less from the default cache than with every layer in fp8."""
    layouts = kv_storage_layouts([KVLayout(2, 16)] * 3, "fp8", NumpyBackend(), ["0", "2"])
    assert [layout.dtype for layout in layouts] == [None, FP8_E4M3, None]
    for given in ("0,2", ["0,2"], [0, 2]):  # the flag's comma form, as the CLI and the Python API pass it
        assert kv_storage_layouts([KVLayout(2, 16)] * 3, "fp8", NumpyBackend(), given) == layouts
    llm = LLM(TINY / "llama", kv_cache_dtype="fp8", kv_high_precision_layers=["0"], kv_cache_memory_gib=1 / 64)
    assert llm.engine.kv.keys[0].dtype == np.float32 and llm.engine.kv.scales[0] is None
    assert all(k.dtype == FP8_E4M3 for k in llm.engine.kv.keys[1:])
    assert llm.engine.kv_dtype == "float32/float8_e4m3fn"
    base, fp8 = LLM(TINY / "llama"), LLM(TINY / "llama", kv_cache_dtype="fp8")
    prompt = mixed_prompts(base.loaded.model.vocab_size, count=1)[0]
    rows, ids = np.arange(len(prompt) - 1), np.asarray(prompt[1:])
    want = full_prompt_logprobs(base, prompt)[rows, ids]
    mixed = np.abs(full_prompt_logprobs(llm, prompt)[rows, ids] - want).mean()
    all_fp8 = np.abs(full_prompt_logprobs(fp8, prompt)[rows, ids] - want).mean()
    assert 0 < mixed < all_fp8


@pytest.mark.parametrize(
    ("dtype", "layers", "message"),
    [
        ("fp8", ["3"], r"'3' is not a KV layer of this model; give indices from 0 to 2 \(its 3 KV layers"),
        ("fp8", "0,5", r"'5' is not a KV layer"),
        ("fp8", ["-1"], r"'-1' is not a KV layer"),
        ("fp8", ["first"], r"'first' is not a KV layer"),
        ("auto", ["0"], r"applies to a KV cache narrower than the activations .* set kv_cache_dtype=fp8"),
    ],
)
def test_high_precision_layers_refuse_what_they_cannot_keep(dtype: str, layers: str | list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kv_storage_layouts([KVLayout(2, 16)] * 3, dtype, NumpyBackend(), layers)


class _FusedOpWithoutScales(NumpyBackend):
    """A backend written before `Backend.qk_norm_rope_write_kv` took ``kv_scales``: its override lacks it."""

    name = "fused-without-scales"

    def qk_norm_rope_write_kv(  # type: ignore[override]
        self, q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos, sin, k_cache, v_cache, slot_mapping
    ):  # noqa: ANN001, ANN202 - the older signature, untyped as a third party's may be
        return Backend.qk_norm_rope_write_kv(
            self, q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos, sin, k_cache, v_cache, slot_mapping
        )


def test_a_fused_op_without_kv_scales_keeps_working_with_fp8_caches() -> None:
    """Its fp8 layers take the separate ops (the fused op is never given ``kv_scales``), with the same results."""
    prompt = mixed_prompts(64, count=1)[0]
    want = full_prompt_logprobs(LLM(TINY / "qwen3", kv_cache_dtype="fp8"), prompt)
    got = full_prompt_logprobs(LLM(TINY / "qwen3", backend=_FusedOpWithoutScales(), kv_cache_dtype="fp8"), prompt)
    np.testing.assert_array_equal(got, want)


class _NoFp8(NumpyBackend):
    name = "nofp8"
    kv_cache_dtypes: frozenset[str] = frozenset()


def test_a_backend_without_fp8_refuses_it_naming_what_it_supports() -> None:
    with pytest.raises(
        ConfigError, match=r"kv_cache_dtype=fp8 is not supported by the 'nofp8' backend; it supports: auto$"
    ):
        kv_storage_layouts([KVLayout(2, 16)], "fp8", _NoFp8())


def test_the_cuda_backend_holds_fp8_kv() -> None:
    """The cuda backend's fp8 caches (its kernels are checked on the GPU by the conformance suite): the layouts
    it is given store E4M3, one byte per element; bf16 is its own activation dtype."""
    gb10 = pytest.importorskip("atlas_gb10.backend")
    backend: type[Backend] = gb10.CudaBackend
    assert "fp8" in backend.kv_cache_dtypes
    fake = object.__new__(backend)
    assert kv_storage_layouts([KVLayout(2, 16)], "fp8", fake) == [KVLayout(2, 16, dtype=FP8_E4M3)]
    assert kv_storage_layouts([KVLayout(2, 16)], "bf16", fake) == [KVLayout(2, 16)]


def test_mla_latent_caches_refuse_fp8() -> None:
    with pytest.raises(ConfigError, match="not supported for MLA latent KV caches"):
        kv_storage_layouts([LatentKVLayout(32, 8)], "fp8", NumpyBackend())
    assert kv_storage_layouts([LatentKVLayout(32, 8)], "auto", NumpyBackend()) == [LatentKVLayout(32, 8)]


def test_checkpoint_scales_are_read_and_applied(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.numpy import load_file, save_file

    folder = TINY.edited_copy(tmp_path, "qwen3")
    files = sorted(folder.glob("*.safetensors"))
    tensors = load_file(files[0])
    tensors["model.layers.0.self_attn.k_scale"] = np.array(0.5, dtype=np.float32)
    tensors["model.layers.0.self_attn.v_scale"] = np.array(0.25, dtype=np.float32)
    tensors["model.layers.1.self_attn.kv_scale"] = np.array(2.0, dtype=np.float32)
    save_file(tensors, files[0])
    llm = LLM(folder, kv_cache_dtype="fp8")
    assert llm.engine.kv.scales[:2] == [(0.5, 0.25), (2.0, 2.0)]
    prompt = mixed_prompts(llm.loaded.model.vocab_size, count=1)[0]
    base = LLM(TINY / "qwen3")
    rows, ids = np.arange(len(prompt) - 1), np.asarray(prompt[1:])
    diff = np.abs(full_prompt_logprobs(base, prompt)[rows, ids] - full_prompt_logprobs(llm, prompt)[rows, ids])
    assert diff.max() <= TOLERANCES["qwen3", "fp8"][1]


def test_the_setting_is_an_engine_option_with_choices() -> None:
    from atlas_core.engine.config import ENGINE_OPTIONS, EngineConfig

    option = {opt.name: opt for opt in ENGINE_OPTIONS}["kv_cache_dtype"]
    assert (option.flag_name, option.env_name, option.choices) == (
        "kv-cache-dtype",
        "ATLAS_KV_CACHE_DTYPE",
        ("auto", "bf16", "fp8"),
    )
    assert EngineConfig().kv_cache_dtype == "auto"
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, bf16, fp8"):
        EngineConfig(kv_cache_dtype="fp4")  # type: ignore[arg-type]
