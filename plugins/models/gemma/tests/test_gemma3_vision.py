"""Gemma 3's vision side against transformers on the tiny ``gemma3_vl`` checkpoint (`VisionParity`:
preprocessing, SigLIP tower and projector features, logits over image + text prompts, greedy decoding
batched with text), the processor's rewrite of the chat text, the checkpoint layouts transformers has
used, text-only Gemma 3, and refusals."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from atlas_core import LLM
from atlas_core.errors import ModelLoadError
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.vision_parity import VisionParity, picture, vision_reference

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
NAME = "gemma3_vl"
FOLDER = TINY / NAME
BOI, EOI, IMAGE = 253, 254, 255
SPECIAL = {BOI: "<start_of_image>", EOI: "<end_of_image>", IMAGE: "<image_soft_token>"}
"""The special tokens' strings in Gemma 3's tokenizer."""


class TestVisionParity(VisionParity):
    """Image + text prompts: preprocessing, tower and projector features, logits, greedy; on every fixture
    of this plugin with a vision reference (``gemma3_vl`` and ``gemma4_vl``)."""

    checkpoints = TINY


def copy_fixture(tmp_path: Path, rename: dict[str, str] | None = None, drop: str | None = None) -> Path:
    """A copy of the fixture with tensor name prefixes replaced (``rename``) or dropped (``drop``)."""
    folder = tmp_path / NAME
    shutil.copytree(FOLDER, folder)
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for name, value in tensors.items():
        if drop is not None and name.startswith(drop):
            continue
        for old, new in (rename or {}).items():
            if name.startswith(old):
                name = new + name.removeprefix(old)
                break
        renamed[name] = value
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize("name", ["gemma3_vl", "gemma4_vl"])
def test_vision_side_settings(name: str) -> None:
    """Both fixtures: image token 255, images attend to themselves (Gemma 4's config asks for it), 1-D RoPE."""
    vision = TINY.shared_llm(name).loaded.model.vision
    assert vision is not None
    assert (vision.image_token_id, vision.bidirectional_images) == (IMAGE, True)
    assert vision.rope_positions([1, 2, IMAGE], []) is None


def test_rewrite_template_text_is_the_processors() -> None:
    """Gemma3Processor replaces each ``<start_of_image>`` of the rendered chat with its
    ``full_image_sequence`` (``"\\n\\n" + boi + image_seq_length image tokens + eoi + "\\n\\n"``); ours writes
    one image token, which the engine expands to the image's tokens."""
    vision = TINY.shared_llm(NAME).loaded.model.vision
    assert vision is not None
    chat = (
        "<bos><start_of_turn>user\n<start_of_image>What is this?<start_of_image><end_of_turn>\n<start_of_turn>model\n"
    )
    image = "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"
    assert vision.rewrite_template_text(chat, SPECIAL.__getitem__) == (
        f"<bos><start_of_turn>user\n{image}What is this?{image}<end_of_turn>\n<start_of_turn>model\n"
    )
    assert vision.rewrite_template_text("no images", SPECIAL.__getitem__) == "no images"


@pytest.mark.parametrize(
    "layout",
    [
        {"vision_tower.": "model.vision_tower.vision_model.", "multi_modal_projector.": "model.multi_modal_projector."},
        {"vision_tower.": "vision_tower.vision_model."},
        {"vision_tower.": "model.vision_tower."},
    ],
    ids=["transformers-4.52", "hub", "model-prefixed"],
)
def test_checkpoint_layouts_give_the_reference_features(tmp_path: Path, layout: dict[str, str]) -> None:
    """The tower and projector under every prefix transformers has saved them with."""
    vision = LLM(copy_fixture(tmp_path, layout), backend="numpy").loaded.model.vision
    assert vision is not None
    features = vision.encode([vision.prepare(picture(FOLDER, "b"))])
    np.testing.assert_allclose(np.asarray(features[0].embeds), vision_reference(FOLDER)["embeds_b"], atol=1e-4, rtol=0)


def test_text_only_gemma3_has_no_vision_side(tmp_path: Path) -> None:
    """Gemma3ForCausalLM, and a gemma3 checkpoint without the tower's weights, load as text models."""
    assert TINY.shared_llm("gemma3").loaded.model.vision is None
    assert LLM(copy_fixture(tmp_path, drop="vision_tower."), backend="numpy").loaded.model.vision is None


def test_image_token_outside_the_vocabulary_leaves_a_text_model(caplog: pytest.LogCaptureFixture) -> None:
    """The ``gemma3_multimodal`` fixture keeps transformers' default image token 262144 beside its 256-row
    vocabulary: it loads as a text model (its text parity is `TestReferenceParity`'s) with a warning."""
    with caplog.at_level(logging.WARNING, logger="atlas.models.gemma"):
        model = LLM(TINY / "gemma3_multimodal", backend="numpy").loaded.model
    assert model.vision is None
    assert "image_token_index 262144 is outside the 256-row embedding table" in caplog.text


def test_tokens_per_image_must_pool_the_patch_grid(tmp_path: Path) -> None:
    """The projector pools whole ``kernel x kernel`` blocks (Gemma 3's 64 x 64 grid 4 x 4 into 256 tokens;
    the fixture's 8 x 8 grid 2 x 2 into 16): a token count that does not is refused."""
    folder = copy_fixture(tmp_path)
    edit_json(folder / "config.json", mm_tokens_per_image=9)
    with pytest.raises(ModelLoadError, match="mm_tokens_per_image 9 must be a square whose side divides the 8 x 8"):
        LLM(folder, backend="numpy")


def test_processor_size_must_be_the_towers(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    edit_json(folder / "preprocessor_config.json", size={"height": 64, "width": 64})
    with pytest.raises(ModelLoadError, match="preprocessor_config.json: size .* must be .*32"):
        LLM(folder, backend="numpy")


def test_pan_and_scan_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = copy_fixture(tmp_path)
    edit_json(folder / "preprocessor_config.json", do_pan_and_scan=True)
    with caplog.at_level(logging.WARNING, logger="atlas.models.gemma"):
        vision = LLM(folder, backend="numpy").loaded.model.vision
    assert "do_pan_and_scan is not supported" in caplog.text
    assert vision is not None
    np.testing.assert_array_equal(
        vision.prepare(picture(FOLDER, "a")).pixel_values, vision_reference(FOLDER)["pixel_values_a"]
    )
