"""Image parity of a vision-language family with the vision references of its tiny checkpoints.

A checkpoint folder that holds ``vision_reference.npz`` (written by the fixture generator beside two images
``image_a.png`` / ``image_b.png``) is checked for: the model's preprocessing (pixel values and patch grid
of each image), the tower's features (and deepstack features where the reference has them), multimodal
RoPE positions (where the reference has them), placeholder expansion, every position's log-softmax over
two image + text prompts within `TOLERANCE`, and the greedy continuation of both image prompts batched
with a text prompt. A family plugin runs these checks with a three-line test class::

    from atlas_core.testing.vision_parity import VisionParity

    class TestVisionParity(VisionParity):
        checkpoints = TinyCheckpoints(Path(__file__).parent / "fixtures" / "tiny")

The reference holds ``pixel_values_K`` / ``grid_K`` / ``embeds_K`` (and optionally ``deepstack_K``
``[layers, tokens, H]``) for each image ``K`` in ``a``, ``b``; and for prompts ``i`` in 0, 1:
``prompt_i`` (placeholders expanded), ``images_i`` (image keys in order), ``logprobs_i``, ``greedy_i``,
``greedy_logprobs_i`` and optionally ``mrope_positions_i`` / ``mrope_delta_i`` and ``bf16_drift_i``
(transformers' own bf16-against-float32 log-prob drift per position, which bounds a bf16 backend's).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from PIL import Image

from atlas_core import LLM, SamplingParams
from atlas_core.model.vision import PreparedImage, VisionModel, expand_placeholders
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import TOLERANCE, full_prompt_logprobs

IMAGE_PROMPTS = 2
REFERENCE_FILE = "vision_reference.npz"
GREEDY_TOKENS = 8


def vision_reference(folder: Path) -> dict[str, np.ndarray]:
    """A checkpoint folder's ``vision_reference.npz``, every array read into memory."""
    with np.load(folder / REFERENCE_FILE) as data:
        return dict(data)


def picture(folder: Path, key: str) -> Image.Image:
    """A checkpoint folder's image ``key`` (``image_{key}.png``), RGB."""
    with Image.open(folder / f"image_{key}.png") as image:
        return image.convert("RGB")


def collapse_placeholders(prompt: list[int], token: int) -> list[int]:
    """``prompt`` with each run of ``token`` cut to one token, as chat templates write image placeholders."""
    return [t for j, t in enumerate(prompt) if t != token or j == 0 or prompt[j - 1] != token]


def vision_of(llm: LLM) -> VisionModel:
    """The loaded model's vision side (asserted present)."""
    vision = llm.loaded.model.vision
    assert vision is not None, "the model has no vision side"
    return vision


class VisionParity:
    """Base of a test class that checks every checkpoint of ``checkpoints`` holding a vision reference
    (``backend``: the registered backend name to run on; default ``numpy``). Models come from
    `TinyCheckpoints.shared_llm`."""

    checkpoints: ClassVar[TinyCheckpoints]
    backend: ClassVar[str] = "numpy"

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "checkpoint" in metafunc.fixturenames:
            names = [name for name in self.checkpoints.names if (self.checkpoints / name / REFERENCE_FILE).is_file()]
            metafunc.parametrize("checkpoint", names)

    def reference(self, checkpoint: str) -> dict[str, np.ndarray]:
        return vision_reference(self.checkpoints / checkpoint)

    def picture(self, checkpoint: str, key: str) -> Image.Image:
        """The checkpoint's image ``key`` (``a`` or ``b``), RGB."""
        return picture(self.checkpoints / checkpoint, key)

    def prompt_images(self, checkpoint: str, reference: dict[str, np.ndarray], i: int) -> list[Image.Image]:
        return [self.picture(checkpoint, key) for key in reference[f"images_{i}"].tolist()]

    def test_preprocessing_matches_reference(self, checkpoint: str) -> None:
        vision, reference = vision_of(self.checkpoints.shared_llm(checkpoint, self.backend)), self.reference(checkpoint)
        for key in "ab":
            prepared = vision.prepare(self.picture(checkpoint, key))
            assert prepared.grid == tuple(reference[f"grid_{key}"])
            assert prepared.num_tokens == len(reference[f"embeds_{key}"])
            np.testing.assert_allclose(prepared.pixel_values, reference[f"pixel_values_{key}"], atol=1e-6, rtol=0)

    def test_one_placeholder_expands_to_the_reference_prompt(self, checkpoint: str) -> None:
        """Each image's single placeholder token, as the chat template (after the processor's rewrite)
        writes it, expands to the reference prompt's run of image tokens."""
        vision, reference = vision_of(self.checkpoints.shared_llm(checkpoint, self.backend)), self.reference(checkpoint)
        token = vision.image_token_id
        for i in range(IMAGE_PROMPTS):
            prompt = reference[f"prompt_{i}"].tolist()
            images = [vision.prepare(image) for image in self.prompt_images(checkpoint, reference, i)]
            ids, placed = expand_placeholders(collapse_placeholders(prompt, token), images, token)
            assert ids == prompt, f"prompt {i}"
            starts = [j for j, t in enumerate(prompt) if t == token and (j == 0 or prompt[j - 1] != token)]
            assert [p.offset for p in placed] == starts, f"prompt {i}"

    def test_tower_features_match_reference(self, checkpoint: str) -> None:
        """Both images in one encoder call (each attends to its own patches only)."""
        vision, reference = vision_of(self.checkpoints.shared_llm(checkpoint, self.backend)), self.reference(checkpoint)
        features = vision.encode([vision.prepare(self.picture(checkpoint, key)) for key in "ab"])
        backend = self.checkpoints.shared_llm(checkpoint, self.backend).engine.backend
        for key, feature in zip("ab", features, strict=True):
            embeds = backend.to_numpy(feature.embeds)
            np.testing.assert_allclose(embeds, reference[f"embeds_{key}"], atol=1e-4, rtol=0)
            if f"deepstack_{key}" in reference:
                deepstack = np.stack([backend.to_numpy(d) for d in feature.deepstack])
                np.testing.assert_allclose(deepstack, reference[f"deepstack_{key}"], atol=1e-4, rtol=0)
            else:
                assert feature.deepstack == []

    def test_rope_positions_match_reference(self, checkpoint: str) -> None:
        llm, reference = self.checkpoints.shared_llm(checkpoint, self.backend), self.reference(checkpoint)
        for i in range(IMAGE_PROMPTS):
            images = [vision_of(llm).prepare(image) for image in self.prompt_images(checkpoint, reference, i)]
            _, placed = llm.engine.prepare_images(reference[f"prompt_{i}"].tolist(), images)
            if f"mrope_positions_{i}" not in reference:
                assert placed.positions is None
                continue
            assert placed.positions is not None
            np.testing.assert_array_equal(placed.positions, reference[f"mrope_positions_{i}"])
            assert placed.delta == int(reference[f"mrope_delta_{i}"])

    def test_image_prompt_logprobs_match_reference(self, checkpoint: str) -> None:
        llm, reference = self.checkpoints.shared_llm(checkpoint, self.backend), self.reference(checkpoint)
        for i in range(IMAGE_PROMPTS):
            images: list[PreparedImage] = [
                vision_of(llm).prepare(image) for image in self.prompt_images(checkpoint, reference, i)
            ]
            ours = full_prompt_logprobs(llm, reference[f"prompt_{i}"].tolist(), images)
            np.testing.assert_allclose(ours, reference[f"logprobs_{i}"], atol=TOLERANCE, rtol=0, err_msg=f"prompt {i}")

    def test_greedy_matches_reference_batched_with_text(self, checkpoint: str) -> None:
        """Both image prompts (each placeholder run given as one token, expanded by the engine) and a text
        prompt in one batch: the image prompts' greedy tokens and their log-probs are the reference's."""
        llm, reference = self.checkpoints.shared_llm(checkpoint, self.backend), self.reference(checkpoint)
        token = vision_of(llm).image_token_id
        text = self.checkpoints.reference(checkpoint)
        prompts: list[dict[str, object]] = []
        for i in range(IMAGE_PROMPTS):
            collapsed = collapse_placeholders(reference[f"prompt_{i}"].tolist(), token)
            prompts.append({"prompt_token_ids": collapsed, "images": self.prompt_images(checkpoint, reference, i)})
        prompts.append({"prompt_token_ids": text["prompt_2"].tolist()})
        params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True, logprobs=0)
        outputs = llm.generate(prompts, params)
        for i in range(IMAGE_PROMPTS):
            completion = outputs[i].outputs[0]
            assert completion.token_ids == reference[f"greedy_{i}"].tolist(), f"prompt {i}"
            assert completion.logprobs is not None
            got = [entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids, strict=True)]
            want = [reference[f"greedy_logprobs_{i}"][step, t] for step, t in enumerate(completion.token_ids)]
            np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0, err_msg=f"prompt {i}")
        assert outputs[-1].outputs[0].token_ids == text["greedy_2"][:GREEDY_TOKENS].tolist()
