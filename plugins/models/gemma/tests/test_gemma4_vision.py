"""Gemma 4's vision side on the tiny ``gemma4_vl`` checkpoint: the processor's rewrite of the chat text, the
patch budget and ``max_pixels``, text-only Gemma 4, and refusals. Its parity with transformers
(preprocessing, tower and embedder features, logits over image + text prompts with bidirectional image
attention on the sliding layers, greedy decoding batched with text) is checked by ``TestVisionParity`` in
test_gemma3_vision.py, which runs on every fixture of this plugin that has a vision reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from atlas_model_gemma.gemma4_image_processor import target_size
from safetensors.numpy import load_file, save_file

from atlas_core import LLM
from atlas_core.errors import ModelLoadError
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import TOLERANCE, max_prompt_logprob_error
from atlas_core.testing.vision_parity import picture, vision_reference

TINY = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")
NAME = "gemma4_vl"
FOLDER = TINY / NAME
BOI, EOI, IMAGE = 253, 254, 255


def copy_fixture(tmp_path: Path, drop: str | None = None) -> Path:
    """A copy of the fixture, without the tensors whose names start with ``drop``."""
    folder = tmp_path / NAME
    shutil.copytree(FOLDER, folder)
    if drop is not None:
        tensors = load_file(folder / "model.safetensors")
        kept = {name: value for name, value in tensors.items() if not name.startswith(drop)}
        save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def edit_json(path: Path, key: str | None = None, **changes: object) -> None:
    """Update ``path``'s JSON object (or its ``key`` sub-object) with ``changes``."""
    data = json.loads(path.read_text())
    if key is None:
        data |= changes
    else:
        data[key] |= changes
    path.write_text(json.dumps(data))


def test_rewrite_template_text_is_the_processors() -> None:
    """Gemma 4's chat template writes ``<|image|>`` per image; ``Gemma4Processor.replace_image_token`` (its
    output recorded by the fixture generator for a two-token image) makes it ``boi + soft tokens + eoi``.
    Ours writes one image token, which the engine expands to the image's tokens."""
    ref = vision_reference(FOLDER)
    marker, replaced = str(ref["template_image"]), str(ref["template_replacement"])
    special = {BOI: str(ref["template_boi"]), EOI: str(ref["template_eoi"]), IMAGE: marker}
    vision = TINY.shared_llm(NAME).loaded.model.vision
    assert vision is not None
    chat = f"<bos><|turn>user\n{marker}What is this?{marker}<turn|>\n<|turn>model\n"
    ours = vision.rewrite_template_text(chat, special.__getitem__)
    assert ours.replace(marker, marker * 2) == chat.replace(marker, replaced)
    assert vision.rewrite_template_text("no images", special.__getitem__) == "no images"


@pytest.mark.parametrize(
    ("size", "budget", "want"),
    [((30, 45), 630, (72, 120)), ((36, 20), 630, (132, 72)), ((1, 400), 630, (12, 840)), ((400, 1), 630, (840, 12))],
)
def test_target_size_is_transformers(size: tuple[int, int], budget: int, want: tuple[int, int]) -> None:
    """``get_aspect_ratio_preserving_size`` with 4 px patches pooled 3 x 3 (a side that rounds to 0 takes one
    12 px block and the other ``floor(ratio)`` blocks, at most the budget's side)."""
    assert target_size(*size, 4, budget, 3) == want


def test_max_pixels_lowers_the_patch_budget() -> None:
    """``max_pixels`` maps onto the patch budget: at most ``max_pixels / 16`` patches of 4 x 4, never below
    one soft token (9 patches); no limit, or a larger one, gives the processor's own 70-token budget."""
    vision = TINY.shared_llm(NAME).loaded.model.vision
    assert vision is not None
    image = picture(FOLDER, "a")
    assert vision.prepare(image, 10**9).grid == vision.prepare(image).grid == (1, 18, 30)
    small = vision.prepare(image, 100 * 16)
    assert small.grid == (1, 6, 12) and small.num_tokens == 8 and small.pixel_values.shape == (72, 48)
    assert vision.prepare(image, 1).num_tokens == 1


def test_text_only_gemma4_has_no_vision_side(tmp_path: Path) -> None:
    """Gemma4ForCausalLM, and a gemma4 checkpoint without the tower's weights (whose text parity holds),
    load as text models."""
    assert TINY.shared_llm("gemma4").loaded.model.vision is None
    llm = LLM(copy_fixture(tmp_path, drop="model.vision_tower."), backend="numpy")
    assert llm.loaded.model.vision is None
    assert max_prompt_logprob_error(llm, TINY.reference(NAME)) <= TOLERANCE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}, "rope_type 'default' is not supported"),
        ({"num_key_value_heads": 1}, "num_key_value_heads 1 must equal num_attention_heads 2"),
    ],
)
def test_unsupported_vision_configs_are_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    folder = copy_fixture(tmp_path)
    edit_json(folder / "config.json", "vision_config", **change)
    with pytest.raises(ModelLoadError, match=f"{NAME}/config.json: vision_config {message}"):
        LLM(folder, backend="numpy")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_soft_tokens": 100}, "max_soft_tokens 100 must be one of"),
        ({"patch_size": 16}, "patch_size 16 must be the vision tower's 4"),
        ({"do_resize": False}, "do_resize false is not supported"),
        ({"resample": 9}, "resample 9 is not a Pillow resampling filter"),
    ],
)
def test_unsupported_processor_settings_are_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    folder = copy_fixture(tmp_path)
    edit_json(folder / "preprocessor_config.json", **change)
    with pytest.raises(ModelLoadError, match=f"preprocessor_config.json: {message}"):
        LLM(folder, backend="numpy")
