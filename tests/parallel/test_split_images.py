"""Images on a model split over ranks: rank 0 alone holds the vision tower and encodes each image, and the
steps it posts carry the image rows (features, deepstack features), the M-RoPE rows and how far image rows
attend (Gemma's bidirectional images), so TP=2 gives the unsplit greedy tokens and log-probabilities
within 1e-5 for an image + text prompt batched with a text prompt, and a repeated image prompt hits the
prefix cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from atlas_core import LLM
from atlas_core.backends.select import select_backend
from atlas_core.comm import SingleProcessComm
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.model.load import load_model
from atlas_core.model.sharding import ShardPlan, TensorParallel
from atlas_core.plugins import get_registry
from tests.conftest import TINY
from tests.parallel.split_runs import KV_GIB, greedy

CHECKPOINTS = ["qwen3_vl", "gemma3_vl"]  # M-RoPE and deepstack features; bidirectional images


def image_prompts(name: str) -> list[Any]:
    """The reference's prompt with two images (placeholders expanded), then a text-only prompt."""
    folder = TINY / name
    with np.load(folder / "vision_reference.npz") as data:
        prompt, keys = data["prompt_1"].tolist(), data["images_1"].tolist()
    images = []
    for key in keys:
        with Image.open(folder / f"image_{key}.png") as image:
            images.append(image.convert("RGB"))
    return [{"prompt_token_ids": prompt, "images": images}, [3, 5, 7, 11, 13, 2]]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_images_on_a_split_model_match_the_whole_model(name: str) -> None:
    folder, prompts = TINY / name, image_prompts(name)
    with LLM(folder, backend="numpy", kv_cache_memory_gib=KV_GIB) as whole:
        expected = greedy(whole, prompts)
    with LLM(folder, backend="numpy", tensor_parallel_size=2, kv_cache_memory_gib=KV_GIB) as llm:
        results = greedy(llm, prompts)
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        (again,) = llm.generate(prompts[:1], params)  # the same image and text: a prefix-cache hit
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(results, expected, strict=True):
        assert tokens == want_tokens
        np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5, rtol=0)
    assert again.num_cached_tokens > 0
    assert again.outputs[0].token_ids == expected[0][0]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_only_rank_0_loads_the_vision_tower(name: str) -> None:
    registry = get_registry()
    backend = select_backend(registry, "numpy")
    for rank, has_tower in [(0, True), (1, False)]:
        parallel = TensorParallel(ShardPlan(rank, 2, 1), SingleProcessComm())  # loading runs no collective
        loaded = load_model(TINY / name, backend, registry, parallel=parallel)
        assert (loaded.model.vision is not None) == has_tower, f"rank {rank}"
