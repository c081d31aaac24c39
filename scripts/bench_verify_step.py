"""Speculative decoding's ceiling on a device: batch-1 steps that verify K draft tokens against plain
decode steps, on random weights of a named shape.

A plain run gives the greedy tokens and the decode speed (captured decode graphs where the backend has
them). Runs with K = 1, 2, 4 then propose exactly those tokens, so every draft is accepted and each
verify step yields K + 1 tokens: the time per verify step beside the plain step is the cost of
verification (a step's time is the run's time over its steps, each yielding one token and its accepted
drafts), and the tokens/s the most a proposer with perfect drafts can reach. Outside the batch-invariant
mode a verify step's rows may round differently from a decode step's; where that changes a greedy token
(random weights give bf16 logits with exact ties at the top), the line says from which token on, and the
known drafts stop matching from there (``--batch-invariant`` keeps them right, on slower kernels).

    python scripts/bench_verify_step.py llama-3-8b qwen3.5-35b-a3b:8 [--tokens 128] [--prompt-len 32]

A ``:N`` suffix keeps the first N layers of a shape that does not fit. ``--mtp`` runs the checkpoint's
MTP layer (random weights too) after every step as MTP speculation does, while the known continuation
is still what is proposed: the ceiling of MTP speculation, its own steps included.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np

from atlas_core.bench.random_weights import random_weights_llm
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.sequence import Sequence

DRAFT_LENGTHS = (1, 2, 4)


class KnownContinuation:
    """Proposes each sequence's known greedy continuation: every draft is accepted, except that every
    ``wrong_every``-th proposal (0: none) has a wrong last token."""

    def __init__(self, continuation: dict[tuple[int, ...], list[int]], wrong_every: int = 0) -> None:
        self.continuation, self.wrong_every, self.calls = continuation, wrong_every, 0

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        drafts = []
        for seq, k in zip(seqs, max_tokens, strict=True):
            draft = self.continuation.get(tuple(seq.token_ids[: seq.num_prompt_tokens]), [])[len(seq.output_ids) :][:k]
            self.calls += 1
            if draft and self.wrong_every and self.calls % self.wrong_every == 0:
                draft = [*draft[:-1], draft[-1] + 1]
            drafts.append(draft)
        return drafts

    def release(self, seq: Sequence) -> None:
        return None


def decode_seconds(llm: Any, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """Seconds of ``tokens - 1`` decode steps' worth of generation (prefill subtracted), and the tokens."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prefill = min(_timed(lambda: llm.generate(prompt, first, use_tqdm=False))[0] for _ in range(3))
    total, outputs = _timed(lambda: llm.generate(prompt, params, use_tqdm=False))
    return total - prefill, outputs[0].outputs[0].token_ids


def _timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def bench(shape: str, tokens: int, prompt_len: int, mtp: bool, wrong_every: int, batch_invariant: bool) -> None:
    name, _, layers = shape.partition(":")
    spec: dict[str, Any] = {"method": "mtp" if mtp else "ngram", "num_speculative_tokens": max(DRAFT_LENGTHS)}
    llm = random_weights_llm(
        name,
        num_layers=int(layers) if layers else None,
        max_seq_len=2048,
        speculative_config=spec,
        batch_invariant=batch_invariant,
    )
    speculation, runner = llm.engine.speculation, llm.engine.runner
    observer, runner.hidden_observer = runner.hidden_observer, None  # plain steps run no MTP layer
    prompt = np.random.default_rng(0).integers(0, llm.loaded.model.vocab_size, prompt_len).tolist()
    speculation.proposer.propose = KnownContinuation({}).propose  # no drafts: plain decode steps
    decode_seconds(llm, prompt, 8)  # warm-up (kernels, graphs)
    plain, greedy = decode_seconds(llm, prompt, tokens)
    step = plain / (tokens - 1)
    mode = ", batch-invariant mode" if batch_invariant else ""
    print(f"{llm.loaded.name}: batch 1, {prompt_len}-token prompt, {tokens} tokens{mode}")
    print(f"  plain decode   {1e3 * step:7.2f} ms/step  {1 / step:7.1f} tok/s")
    graphs, llm.engine.runner.decode_graphs = llm.engine.runner.decode_graphs, None
    eager = decode_seconds(llm, prompt, tokens)[0] / (tokens - 1)
    llm.engine.runner.decode_graphs = graphs
    print(f"  eager decode   {1e3 * eager:7.2f} ms/step  {1 / eager:7.1f} tok/s (no captured graphs, as verify steps)")
    speculation.proposer.propose = KnownContinuation({tuple(prompt): greedy}, wrong_every).propose
    runner.hidden_observer = observer
    if mtp:
        print("  (the MTP layer runs after every verify step; its drafts are replaced by the known tokens)")
    for k in DRAFT_LENGTHS:
        speculation.config = type(speculation.config)(speculation.config.method, k)  # K drafts per step
        if mtp:
            speculation.proposer.num_tokens = k  # the MTP layer's chained steps per verify step
        decode_seconds(llm, prompt, 8)  # warm-up of this shape
        stats = llm.engine.runner.spec_stats
        proposed, accepted = stats.proposed, stats.accepted
        seconds, got = decode_seconds(llm, prompt, tokens)
        same = next((i for i, (a, b) in enumerate(zip(got, greedy, strict=True)) if a != b), len(greedy))
        rate = (stats.accepted - accepted) / max(1, stats.proposed - proposed)
        per_step = seconds / (tokens - 1 - (stats.accepted - accepted))  # a step yields 1 + its accepted drafts
        agreement = "" if same == len(greedy) else f", plain decoding's tokens up to token {same} only"
        print(
            f"  verify K={k}     {1e3 * per_step:7.2f} ms/step  ({per_step / step:.2f}x a decode step) "
            f"{(tokens - 1) / seconds:7.1f} tok/s, {step * (tokens - 1) / seconds:.2f}x plain, "
            f"{100 * rate:.0f}% accepted{agreement}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="presets of atlas bench --random-weights, NAME or NAME:LAYERS")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--mtp", action="store_true", help="run the MTP layer after every verify step")
    parser.add_argument(
        "--wrong-every", type=int, default=0, help="every N-th proposal has a wrong last token (0: all accepted)"
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="verify rows give the bits of decode rows, so the known drafts stay right (slower kernels)",
    )
    args = parser.parse_args()
    for shape in args.shapes:
        bench(shape, args.tokens, args.prompt_len, args.mtp, args.wrong_every, args.batch_invariant)


if __name__ == "__main__":
    main()
