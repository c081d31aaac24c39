"""How far bf16 moves each tiny checkpoint's prompt log-probabilities: the cuda backend and
transformers in bf16 on the GPU, both against the checkpoint's fp32 reference (reference.npz).

    python3 plugins/gb10/scripts/bf16_drift.py [NAME ...]

Prints, per checkpoint and prompt, the largest |log p| difference over the probable tokens
(p > 1e-3 in fp32) for each side: where transformers drifts as far as the cuda backend, the
difference is bf16 arithmetic, not a kernel or wiring error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from atlas_core import LLM
from atlas_core.testing.checkpoints import TinyCheckpoints
from atlas_core.testing.parity import full_prompt_logprobs

TINY = TinyCheckpoints(*sorted(Path(__file__).parents[3].glob("plugins/models/*/tests/fixtures/tiny")))


def transformers_logprobs(name: str, prompts: list[list[int]]) -> list[np.ndarray] | str:
    try:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(TINY / name, dtype=torch.bfloat16).cuda().eval()
    except Exception as exc:  # noqa: BLE001 - a family this transformers does not know
        return f"transformers: {type(exc).__name__}: {str(exc)[:80]}"
    out = []
    with torch.no_grad():
        for prompt in prompts:
            logits = model(torch.tensor([prompt], device="cuda")).logits[0].float()
            out.append(torch.log_softmax(logits, -1).cpu().numpy())
    return out


def drift(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |log p| difference over the probable tokens."""
    return float(np.abs(got - want)[want > np.log(1e-3)].max())


def main(names: list[str]) -> None:
    import cupy

    for name in names or TINY.names:
        ref = TINY.reference(name)
        prompts = [ref[f"prompt_{i}"].tolist() for i in range(4)]
        wants = [ref[f"logprobs_{i}"] for i in range(4)]
        try:
            cupy.get_default_memory_pool().free_all_blocks()
            free, total = cupy.cuda.runtime.memGetInfo()
            llm = LLM(TINY / name, backend="cuda", gpu_memory_utilization=min(1.0, (total - free + 2**30) / total))
            ours = [f"{drift(full_prompt_logprobs(llm, p), w):.3f}" for p, w in zip(prompts, wants, strict=True)]
            del llm
        except Exception as exc:  # noqa: BLE001 - report and go on to the next checkpoint
            ours = [f"atlas: {type(exc).__name__}: {str(exc)[:80]}"]
        theirs = transformers_logprobs(name, prompts)
        if not isinstance(theirs, str):
            theirs = " ".join(f"{drift(t, w):.3f}" for t, w in zip(theirs, wants, strict=True))
        print(f"{name:28s} cuda {' '.join(ours):32s} transformers-bf16 {theirs}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
