"""Qwen3.5's vision side on the tiny ``qwen3_5`` checkpoint (published form: text stack and vision tower in
one checkpoint) against transformers: preprocessing, tower features, M-RoPE positions, logits over image +
text prompts and greedy decoding batched with text (`VisionParity`); the hybrid stack's prefix cache keyed
by image content, and prefill chunks that cut an image."""

from __future__ import annotations

from pathlib import Path

from PIL import ImageOps

from atlas_core import LLM, SamplingParams
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.vision_parity import VisionParity, picture, vision_reference

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
FOLDER = TINY / "qwen3_5"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


class TestVisionParity(VisionParity):
    checkpoints = TINY


def test_prefix_cache_keys_include_the_image() -> None:
    """The same image and text resume from a cached state snapshot; a mirrored image of the same size
    does not hit, and both give their own continuation."""
    llm = LLM(FOLDER, kv_cache_memory_gib=1 / 64)
    ids = vision_reference(FOLDER)["prompt_0"].tolist()
    first = llm.generate({"prompt_token_ids": ids, "images": [picture(FOLDER, "a")]}, GREEDY)[0]
    again = llm.generate({"prompt_token_ids": ids, "images": [picture(FOLDER, "a")]}, GREEDY)[0]
    mirrored = llm.generate({"prompt_token_ids": ids, "images": [ImageOps.mirror(picture(FOLDER, "a"))]}, GREEDY)[0]
    assert again.num_cached_tokens > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids == vision_reference(FOLDER)["greedy_0"].tolist()
    assert mirrored.num_cached_tokens == 0
    assert mirrored.outputs[0].token_ids != first.outputs[0].token_ids


def test_prefill_chunks_that_cut_images_keep_the_reference_tokens() -> None:
    """Chunks of 7 tokens cut both images of prompt 1; the recurrent layers carry their state across the
    cuts and the M-RoPE rows follow each chunk's share of the image."""
    llm = LLM(FOLDER, kv_cache_memory_gib=1 / 64, max_prefill_tokens=7, enable_prefix_caching=False)
    prompt = {
        "prompt_token_ids": vision_reference(FOLDER)["prompt_1"].tolist(),
        "images": [picture(FOLDER, "b"), picture(FOLDER, "a")],
    }
    assert llm.generate(prompt, GREEDY)[0].outputs[0].token_ids == vision_reference(FOLDER)["greedy_1"].tolist()
