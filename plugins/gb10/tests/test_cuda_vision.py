"""Vision-language models on the cuda backend: the vision towers (core's ``vision`` op group on CUDA:
LayerNorm, GELU, attention within each image) and image prompts with bidirectional image attention
(Gemma 3) or M-RoPE (Qwen3-VL, Qwen3.5), against the numpy backend running the same bf16-rounded weights.
Needs a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend
from PIL import Image

from atlas_core import LLM
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import full_prompt_logprobs

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))
REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

VISION = [name for name in TINY.names if (TINY / name / "vision_reference.npz").is_file()]
BF16 = np.dtype(ml_dtypes.bfloat16)
FEATURE_TOLERANCE = 0.05
"""Largest |difference| of tower features relative to their largest magnitude (bf16 activations)."""
LOGPROB_TOLERANCE, NEAR_TIE_LIMIT = 0.1, 3.0
"""As in test_cuda_models: the median position's probable tokens, and every position; raised to transformers'
own bf16 drift on the fixture where that is larger (``bf16_drift_i`` in the reference: Gemma 4's unscaled
attention makes its tiny random fixture far more sensitive to bf16 rounding than the others)."""


def bf16_copy(name: str, destination: Path) -> Path:
    """A copy of tiny checkpoint ``name`` with its floating-point tensors rounded to bf16 (file dtype kept)."""
    from safetensors.numpy import load_file, save_file

    folder = TINY.edited_copy(destination, name)
    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        save_file({k: a.astype(BF16).astype(a.dtype) if a.dtype.kind == "f" else a for k, a in tensors.items()}, path)
    return folder


def pictures(folder: Path, keys: list[str]) -> list[Image.Image]:
    images = []
    for key in keys:
        with Image.open(folder / f"image_{key}.png") as image:
            images.append(image.convert("RGB"))
    return images


@pytest.mark.parametrize("name", VISION)
def test_image_prompts_match_the_numpy_backend(name: str, tmp_path: Path) -> None:
    folder = bf16_copy(name, tmp_path)
    with np.load(folder / "vision_reference.npz") as data:
        reference = dict(data)
    cuda = LLM(folder, backend="cuda", kv_cache_memory_gib=1 / 16)  # whatever the tests before it hold
    host = LLM(folder, backend="numpy", kv_cache_memory_gib=1 / 16)
    vision_cuda, vision_host = cuda.loaded.model.vision, host.loaded.model.vision
    assert vision_cuda is not None and vision_host is not None
    images = pictures(folder, ["a", "b"])
    got = vision_cuda.encode([vision_cuda.prepare(image) for image in images])
    want = vision_host.encode([vision_host.prepare(image) for image in images])
    for g, w in zip(got, want, strict=True):
        host_embeds = np.asarray(w.embeds, dtype=np.float32)
        error = np.abs(cuda.engine.backend.to_numpy(g.embeds).astype(np.float32) - host_embeds).max()
        assert error < FEATURE_TOLERANCE * np.abs(host_embeds).max(), f"{name}: tower features off by {error}"
    drifts, peer = [], []
    for i in range(2):
        peer += reference[f"bf16_drift_{i}"].tolist()
        keys = reference[f"images_{i}"].tolist()
        prompt = reference[f"prompt_{i}"].tolist()
        got_lp = full_prompt_logprobs(cuda, prompt, [vision_cuda.prepare(p) for p in pictures(folder, keys)])
        want_lp = full_prompt_logprobs(host, prompt, [vision_host.prepare(p) for p in pictures(folder, keys)])
        assert np.isfinite(got_lp).all()
        drifts += [np.abs(g - w)[w > np.log(1e-3)].max() for g, w in zip(got_lp, want_lp, strict=True)]
    shown = f"{name}: per-position drifts {np.round(drifts, 2)}, transformers bf16's {np.round(peer, 2)}"
    assert np.median(drifts) < max(LOGPROB_TOLERANCE, np.median(peer)), shown
    assert max(drifts) < max(NEAR_TIE_LIMIT, max(peer)), shown
