"""atlas-model-qwen3-vl against transformers on the tiny ``qwen3_vl`` and ``qwen3_vl_moe`` checkpoints: the
image processor's pixel values, the tower's merged and deepstack features, M-RoPE positions, logits over
image + text prompts and greedy decoding (alone and batched with text), published (transposed) fused
experts, the prefix cache keyed by image content, and refusals."""

from __future__ import annotations

import io
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from atlas_model_qwen3_vl.vision import mrope_axes
from PIL import Image, ImageOps
from safetensors.numpy import load_file, save_file

from atlas_core import LLM, SamplingParams
from atlas_core.errors import InvalidRequestError
from atlas_core.model.images import decode_image
from atlas_core.model.vision import PreparedImage
from atlas_core.plugins import load_plugins
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import TOLERANCE, ReferenceParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
FOLDER = TINY / "qwen3_vl"
NAMES = ["qwen3_vl", "qwen3_vl_moe"]
IMAGE_TOKEN = 250
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)


class TestReferenceParity(ReferenceParity):
    """Text-only prompts: the text stack alone."""

    checkpoints = TINY


@pytest.fixture(scope="module", params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(TINY / name / "vision_reference.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def llm(name: str) -> LLM:
    return TINY.shared_llm(name)


@pytest.fixture(scope="module")
def dense() -> LLM:
    return TINY.shared_llm("qwen3_vl")


def picture(name: str) -> Image.Image:
    with Image.open(FOLDER / f"image_{name}.png") as image:
        return image.convert("RGB")


def prompt_images(llm: LLM, reference: dict[str, np.ndarray], i: int) -> list[PreparedImage]:
    vision = llm.loaded.model.vision
    assert vision is not None
    return [vision.prepare(picture(name)) for name in reference[f"images_{i}"].tolist()]


@pytest.mark.parametrize("model_type", NAMES)
def test_registration(model_type: str) -> None:
    registration = load_plugins().get("model", model_type)
    assert registration.plugin.distribution == "atlas-model-qwen3-vl"


def test_processor_gives_transformers_pixel_values(llm: LLM, reference: dict[str, np.ndarray]) -> None:
    vision = llm.loaded.model.vision
    assert vision is not None
    for name in "ab":
        prepared = vision.prepare(picture(name))
        assert prepared.grid == tuple(reference[f"grid_{name}"])
        assert prepared.num_tokens == int(np.prod(reference[f"grid_{name}"])) // 4
        np.testing.assert_allclose(prepared.pixel_values, reference[f"pixel_values_{name}"], atol=1e-6, rtol=0)


def test_tower_features_match(llm: LLM, reference: dict[str, np.ndarray]) -> None:
    """Both images in one encoder call (each attends to its own patches only)."""
    vision = llm.loaded.model.vision
    assert vision is not None
    features = vision.encode([vision.prepare(picture(name)) for name in "ab"])
    for name, feature in zip("ab", features, strict=True):
        np.testing.assert_allclose(feature.embeds, reference[f"embeds_{name}"], atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.stack(feature.deepstack), reference[f"deepstack_{name}"], atol=1e-4, rtol=0)


def test_mrope_positions_and_axes(llm: LLM, reference: dict[str, np.ndarray]) -> None:
    for i in range(2):
        _, images = llm.engine.prepare_images(reference[f"prompt_{i}"].tolist(), prompt_images(llm, reference, i))
        assert images.positions is not None
        np.testing.assert_array_equal(images.positions, reference[f"mrope_positions_{i}"])
        assert images.delta == int(reference[f"mrope_delta_{i}"])
    assert mrope_axes(8, [4, 2, 2]).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]


def image_prompt_logprobs(llm: LLM, prompt: list[int], images: list[PreparedImage]) -> np.ndarray:
    """``[T, V]`` log-softmax of every position of an image prompt, from one prefill."""
    engine = llm.engine
    engine.add_request("score", None, prompt, SamplingParams(max_tokens=1, prompt_logprobs=0), images)
    try:
        batch, _ = engine.runner.build_batch(engine.scheduler.schedule().chunks)
        assert batch.visual is not None and batch.rope_rows is not None
        hidden = llm.loaded.model.forward(batch, engine.kv)
        return engine.backend.to_numpy(engine.backend.log_softmax(llm.loaded.model.compute_logits(hidden)))
    finally:
        engine.abort("score")


def test_image_prompt_logits_match(llm: LLM, reference: dict[str, np.ndarray]) -> None:
    for i in range(2):
        ours = image_prompt_logprobs(llm, reference[f"prompt_{i}"].tolist(), prompt_images(llm, reference, i))
        np.testing.assert_allclose(ours, reference[f"logprobs_{i}"], atol=TOLERANCE, rtol=0, err_msg=f"prompt {i}")


def test_greedy_batched_with_text_prompts(name: str, llm: LLM, reference: dict[str, np.ndarray]) -> None:
    """Both image prompts (placeholders given as one token each, expanded by the engine) and a text prompt
    in one batch: greedy tokens and their log-probs are the reference's."""
    text = TINY.reference(name)
    prompts: list[dict[str, object]] = []
    for i in range(2):
        ids = reference[f"prompt_{i}"].tolist()
        collapsed = [t for j, t in enumerate(ids) if t != IMAGE_TOKEN or ids[j - 1] != IMAGE_TOKEN]
        prompts.append(
            {"prompt_token_ids": collapsed, "images": [picture(n) for n in reference[f"images_{i}"].tolist()]}
        )
    prompts.append({"prompt_token_ids": text["prompt_2"].tolist()})
    outputs = llm.generate(prompts, GREEDY)
    for i in range(2):
        completion = outputs[i].outputs[0]
        assert completion.token_ids == reference[f"greedy_{i}"].tolist()
        assert completion.logprobs is not None
        for step, (entry, token) in enumerate(zip(completion.logprobs, completion.token_ids, strict=True)):
            assert abs(entry[token].logprob - reference[f"greedy_logprobs_{i}"][step, token]) < TOLERANCE
    assert outputs[2].outputs[0].token_ids == text["greedy_2"][:8].tolist()


def test_published_expert_layout_is_transposed_on_load(tmp_path: Path) -> None:
    """Qwen3-VL-MoE as published stores fused experts transposed ([E, H, 2I], [E, I, H]): same model."""
    name, llm = "qwen3_vl_moe", TINY.shared_llm("qwen3_vl_moe")
    folder = tmp_path / name
    shutil.copytree(TINY / name, folder)
    weights = load_file(folder / "model.safetensors")
    fused = [key for key in weights if key.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(fused) == 4
    save_file(
        {k: np.ascontiguousarray(v.transpose(0, 2, 1)) if k in fused else v for k, v in weights.items()},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    prompt = TINY.reference(name)["prompt_3"].tolist()
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    ours = LLM(folder, kv_cache_memory_gib=1 / 64).generate(prompt, params)[0].outputs[0]
    want = llm.generate(prompt, params)[0].outputs[0]
    assert ours.token_ids == want.token_ids
    assert ours.logprobs is not None and want.logprobs is not None
    assert [e[t].logprob for e, t in zip(ours.logprobs, ours.token_ids, strict=True)] == pytest.approx(
        [e[t].logprob for e, t in zip(want.logprobs, want.token_ids, strict=True)], abs=1e-5
    )


def test_prefix_cache_keys_include_the_image(dense: LLM) -> None:
    """The same image and text reuse the cached blocks; a different image of the same size does not."""
    llm = dense
    with np.load(FOLDER / "vision_reference.npz") as data:
        reference = dict(data)
    ids = reference["prompt_0"].tolist()
    same = llm.generate({"prompt_token_ids": ids, "images": [picture("a")]}, GREEDY)[0]
    again = llm.generate({"prompt_token_ids": ids, "images": [picture("a")]}, GREEDY)[0]
    mirrored = llm.generate({"prompt_token_ids": ids, "images": [ImageOps.mirror(picture("a"))]}, GREEDY)[0]
    block = llm.engine.kv.block_size
    assert again.num_cached_tokens == (len(ids) - 1) // block * block > 0
    assert again.outputs[0].token_ids == same.outputs[0].token_ids == reference["greedy_0"].tolist()
    assert mirrored.num_cached_tokens == 0  # the first block already holds image tokens
    assert mirrored.outputs[0].token_ids != same.outputs[0].token_ids


def png_header(width: int, height: int) -> bytes:
    """A PNG file with only a signature, an IHDR chunk for ``width x height`` and IEND (no pixel data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


def encoded(image: Image.Image, kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, kind)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (encoded(picture("a"))[:200], "cannot be decoded"),
        (encoded(Image.new("RGB", (1, 1))), "at least 2 pixels"),
        (png_header(20000, 20000), "image is too large"),
        (png_header(6000, 6000), "image is too large: 6000x6000 = 36000000 pixels"),
        (b"%PDF-1.7 not an image", "not an image in a supported format"),
        (encoded(picture("a"), "TIFF"), "not an image in a supported format"),
    ],
    ids=["truncated-png", "1x1", "20k-by-20k", "6k-by-6k", "pdf", "tiff"],
)
def test_bad_images_are_refused_naming_the_part(dense: LLM, data: bytes, message: str) -> None:
    llm = dense
    with pytest.raises(InvalidRequestError, match=rf"prompts\[0\]\.images\[0\]: .*{message}"):
        llm.generate({"prompt_token_ids": [1, IMAGE_TOKEN, 2], "images": [data]}, GREEDY)
    assert decode_image(encoded(picture("b")), "x").size == (20, 36)


def test_placeholders_must_pair_with_images(dense: LLM) -> None:
    llm = dense
    with pytest.raises(InvalidRequestError, match="1 image placeholder"):
        llm.generate({"prompt_token_ids": [1, IMAGE_TOKEN, 2], "images": [picture("a"), picture("b")]}, GREEDY)
    with pytest.raises(InvalidRequestError, match="3 tokens long"):
        llm.generate({"prompt_token_ids": [1, *[IMAGE_TOKEN] * 3, 2], "images": [picture("a")]}, GREEDY)
    assert not llm.engine.has_unfinished()


def test_chunked_prefill_encodes_each_image_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill chunks of 7 tokens cut both images of prompt 1 several times: each chunk takes its share of
    the rows, the tower runs once per image, and the greedy tokens are the reference's."""
    with np.load(FOLDER / "vision_reference.npz") as data:
        reference = dict(data)
    llm = LLM(FOLDER, kv_cache_memory_gib=1 / 64, max_prefill_tokens=7, enable_prefix_caching=False)
    vision = llm.loaded.model.vision
    assert vision is not None
    encoded: list[int] = []
    encode = vision.encode

    def counting(images: list[PreparedImage]) -> Any:
        encoded.append(len(images))
        return encode(images)

    monkeypatch.setattr(vision, "encode", counting)
    prompt = {"prompt_token_ids": reference["prompt_1"].tolist(), "images": [picture("b"), picture("a")]}
    output = llm.generate(prompt, GREEDY)[0].outputs[0]
    assert output.token_ids == reference["greedy_1"].tolist()
    assert encoded == [1, 1]  # image b in the first chunks, image a later: one encoder call each
