"""atlas-model-qwen3-vl against transformers on the tiny ``qwen3_vl`` and ``qwen3_vl_moe`` checkpoints: text
and image parity (`ReferenceParity`, `VisionParity`: preprocessing, tower and deepstack features, M-RoPE
positions, logits over image + text prompts, greedy decoding batched with text), published (transposed)
fused experts, the prefix cache keyed by image content, chunked prefill across images, and refusals."""

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
from atlas_core.testing.parity import ReferenceParity
from atlas_core.testing.vision_parity import VisionParity

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
FOLDER = TINY / "qwen3_vl"
NAMES = ["qwen3_vl", "qwen3_vl_moe"]
IMAGE_TOKEN = 250
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)


class TestReferenceParity(ReferenceParity):
    """Text-only prompts: the text stack alone."""

    checkpoints = TINY


class TestVisionParity(VisionParity):
    """Image + text prompts: preprocessing, tower and deepstack features, M-RoPE, logits, greedy."""

    checkpoints = TINY


@pytest.fixture(scope="module")
def dense() -> LLM:
    return TINY.shared_llm("qwen3_vl")


def picture(name: str) -> Image.Image:
    with Image.open(FOLDER / f"image_{name}.png") as image:
        return image.convert("RGB")


@pytest.mark.parametrize("model_type", NAMES)
def test_registration(model_type: str) -> None:
    registration = load_plugins().get("model", model_type)
    assert registration.plugin.distribution == "atlas-model-qwen3-vl"


def test_mrope_axes_interleave_the_sections() -> None:
    assert mrope_axes(8, [4, 2, 2]).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]


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
