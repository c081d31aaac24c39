#!/usr/bin/env python
"""Qwen3-VL's vision encoder in Atlas beside transformers, on CPU or a GPU, at a published tower's shape.

Two steps, one per environment (the engine never imports torch):

    # in a virtual environment with torch and transformers 5.23 (see make_tiny_checkpoints.py):
    python scripts/bench_vision_encoder.py make /tmp/vl-bench --blocks 4 --sizes 512 1024
    # in the project's environment:
    uv run python scripts/bench_vision_encoder.py atlas /tmp/vl-bench

``make`` writes a checkpoint with Qwen3-VL-8B's vision tower (hidden 1152, 16 heads, MLP 4304, patch 16,
2x2 merge; the first ``--blocks`` blocks, deepstack after blocks 0..2 of them) on a one-layer text stack,
Qwen3-VL's ``preprocessor_config.json`` and one deterministic square PNG per ``--sizes`` side; it runs
transformers' processor and tower (float32, eager attention, ``--threads`` threads) over each image and
saves the merged features and the times. Times are the process's CPU seconds (`time.process_time`: every
thread's), so that other work on the machine does not count; run ``atlas`` with ``OPENBLAS_NUM_THREADS=1``
to compare with one torch thread. ``atlas`` loads the checkpoint on the NumPy backend, prepares and
encodes the same images, checks the features against transformers' and prints both times per image.

On a GPU (one environment with torch, transformers and Atlas): ``make --device cuda`` runs transformers'
tower in bf16 with sdpa attention and ``atlas --backend cuda`` Atlas's; both are then timed by the wall
clock after a warm-up call, the device synchronised (best of ``--repeats``), and so is the time to the
first token of a prompt made of the image and 100 text tokens (preprocessing included; transformers'
``generate`` with ``max_new_tokens=1``, Atlas's ``LLM.generate`` with ``max_tokens=1``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
}
IMAGE_TOKEN, VISION_START, VISION_END = 250, 248, 249
TTFT_TEXT_TOKENS = 100
PROCESSOR = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_mean": [0.5] * 3,
    "image_std": [0.5] * 3,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}


def picture(side: int) -> np.ndarray:
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    rng = np.random.default_rng(side)
    base = np.stack([x / side, y / side, (x + y) / (2 * side)], axis=-1) * 200
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def clock(device: str) -> Callable[[], float]:
    """CPU seconds of the process on the CPU; wall-clock seconds after a device synchronisation on a GPU."""
    if device == "cpu":
        return time.process_time
    import torch

    def synchronised() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()

    return synchronised


def make(folder: Path, blocks: int, sizes: list[int], threads: int, repeats: int, device: str = "cpu") -> None:
    import torch
    from PIL import Image
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as Processor,
        )
    except ImportError:  # transformers before the PIL processors
        from transformers import Qwen2VLImageProcessor as Processor

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    vision = {
        **VISION,
        "depth": blocks,
        "deepstack_visual_indexes": list(range(min(3, blocks))),
        "out_hidden_size": 256,
    }
    text = {
        "vocab_size": 256,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5e6,
            "mrope_section": [12, 10, 10],
            "mrope_interleaved": True,
        },
    }
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        video_token_id=251,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    gpu = device != "cpu"
    dtype = torch.bfloat16 if gpu else torch.float32
    model = Qwen3VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa" if gpu else "eager", dtype=dtype
    )
    model.eval().save_pretrained(folder)
    model.to(device)
    processor = Processor(**PROCESSOR)
    processor.save_pretrained(folder)
    timings: dict[str, float] = {}
    now = clock(device)
    for side in sizes:
        Image.fromarray(picture(side)).save(folder / f"image_{side}.png")
        with Image.open(folder / f"image_{side}.png") as image:
            start = time.process_time()
            batch = processor(images=[image], return_tensors="pt")
            prepared = time.process_time()
        pixels, grid = batch["pixel_values"].to(device, dtype), batch["image_grid_thw"].to(device)
        with torch.no_grad():
            for _ in range(repeats + gpu):  # on a GPU, the first call warms up
                begin = now()
                merged = model.model.visual(pixels, grid_thw=grid).pooler_output
                timings[f"encode_{side}"] = min(timings.get(f"encode_{side}", 1e9), now() - begin)
        timings[f"prepare_{side}"] = prepared - start
        np.save(folder / f"merged_{side}.npy", merged.float().cpu().numpy())
        if gpu:
            timings[f"ttft_{side}"] = transformers_ttft(model, processor, folder / f"image_{side}.png", repeats, now)
        print(
            f"transformers {side}x{side}: {int(batch['image_grid_thw'].prod())} patches, prepare "
            f"{timings[f'prepare_{side}']:.3f} s, encode {timings[f'encode_{side}']:.3f} s"
        )
    (folder / "timings_transformers.json").write_text(json.dumps({"threads": threads, "device": device, **timings}))


def ttft_prompt(tokens: int) -> list[int]:
    """An image placeholder between the vision start and end tokens, then ``tokens`` text tokens."""
    return [VISION_START, IMAGE_TOKEN, VISION_END] + [int(t) for t in np.arange(tokens) % 200 + 10]


def transformers_ttft(model, processor, path: Path, repeats: int, now: Callable[[], float]) -> float:  # noqa: ANN001
    """Best wall time of transformers' ``generate`` for one token from the image and a 100-token prompt,
    preprocessing included."""
    import torch
    from PIL import Image

    best = 1e9
    for _ in range(repeats + 1):
        begin = now()
        with Image.open(path) as image:
            batch = processor(images=[image.convert("RGB")], return_tensors="pt")
        grid = batch["image_grid_thw"]
        image_tokens = int(grid.prod()) // 4
        ids = ttft_prompt(TTFT_TEXT_TOKENS)
        ids = ids[:1] + [IMAGE_TOKEN] * image_tokens + ids[2:]
        device = next(model.parameters()).device
        with torch.no_grad():
            model.generate(
                input_ids=torch.tensor([ids], device=device),
                pixel_values=batch["pixel_values"].to(device, model.dtype),
                image_grid_thw=grid.to(device),
                max_new_tokens=1,
                do_sample=False,
            )
        best = min(best, now() - begin)
    return best


def atlas(folder: Path, repeats: int, backend: str = "numpy") -> None:
    from PIL import Image

    from atlas_core import LLM, SamplingParams

    llm = LLM(folder, backend=backend, kv_cache_memory_gib=1 / 64, enable_prefix_caching=False)  # no image hits
    vision = llm.loaded.model.vision
    assert vision is not None
    gpu = backend != "numpy"

    def now() -> float:
        return time.perf_counter() if gpu else time.process_time()

    reference = json.loads((folder / "timings_transformers.json").read_text())
    for path in sorted(folder.glob("image_*.png"), key=lambda p: int(p.stem.split("_")[1])):
        side = int(path.stem.split("_")[1])
        with Image.open(path) as image:
            start = time.process_time()
            prepared = vision.prepare(image.convert("RGB"))
            prepare = time.process_time() - start
        encode = 1e9
        for _ in range(repeats + gpu):  # on a GPU, the first call compiles kernels and warms up
            begin = now()
            embeds = llm.engine.backend.to_numpy(vision.encode([prepared])[0].embeds)  # synchronises
            encode = min(encode, now() - begin)
        error = float(np.abs(np.asarray(embeds, dtype=np.float32) - np.load(folder / f"merged_{side}.npy")).max())
        print(
            f"{side}x{side} ({prepared.pixel_values.shape[0]} patches, {prepared.num_tokens} tokens): "
            f"prepare atlas {prepare:.3f} s / transformers {reference[f'prepare_{side}']:.3f} s; "
            f"encode atlas {encode:.3f} s / transformers {reference[f'encode_{side}']:.3f} s "
            f"({reference.get('device', 'cpu')}, {reference['threads']} torch threads); max |delta| of merged "
            f"features {error:.2e}"
        )
        if gpu:
            ttft = 1e9
            for _ in range(repeats + 1):
                begin = now()
                with Image.open(path) as image:
                    prompt = {"prompt_token_ids": ttft_prompt(TTFT_TEXT_TOKENS), "images": [image.convert("RGB")]}
                    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0))
                ttft = min(ttft, now() - begin)
            print(
                f"{side}x{side} image + {TTFT_TEXT_TOKENS}-token prompt, time to first token: atlas {ttft:.3f} s / "
                f"transformers generate {reference[f'ttft_{side}']:.3f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="step", required=True)
    made = sub.add_parser("make", help="write the checkpoint and transformers' features and times (torch)")
    made.add_argument("folder", type=Path)
    made.add_argument("--blocks", type=int, default=4, help="vision blocks kept (Qwen3-VL-8B has 27)")
    made.add_argument("--sizes", type=int, nargs="+", default=[512, 1024], help="square image sides in pixels")
    made.add_argument("--threads", type=int, default=1)
    made.add_argument("--repeats", type=int, default=1)
    made.add_argument("--device", default="cpu", help="cpu, or cuda (bf16, sdpa)")
    run = sub.add_parser("atlas", help="encode the same images with Atlas and compare")
    run.add_argument("folder", type=Path)
    run.add_argument("--repeats", type=int, default=1)
    run.add_argument("--backend", default="numpy")
    args = parser.parse_args()
    if args.step == "make":
        make(args.folder, args.blocks, args.sizes, args.threads, args.repeats, args.device)
    else:
        atlas(args.folder, args.repeats, args.backend)


if __name__ == "__main__":
    main()
