#!/usr/bin/env python
"""Generate the tiny reference checkpoints: every package's ``tests/fixtures/tiny/<name>`` folders.

This is a development-only tool. The engine itself never imports torch; the
fixtures it writes are committed so that CI (NumPy only) can compare the
engine's logits against Hugging Face ``transformers``.

How to run
----------
Inside a virtual environment that has the CPU build of ``torch`` and
``transformers==5.23.*`` (plus ``safetensors`` and ``numpy``)::

    python -m venv .venv-oracle
    .venv-oracle/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch
    .venv-oracle/bin/pip install "transformers==5.23.*" safetensors numpy
    .venv-oracle/bin/python scripts/make_tiny_checkpoints.py

Specs come from every ``tests/fixtures/tiny_specs.py`` module of the
repository (see ``tiny_checkpoint_specs.py``); each fixture is written beside
its spec module, into that package's ``tests/fixtures/tiny/<name>``.

Options: ``--only NAME`` (repeatable) to regenerate a subset, ``--out DIR`` to
write every fixture into ``DIR`` instead (e.g. to compare with the committed
ones), ``--list`` to print each fixture and its folder without generating.
Every fixture folder is deleted and rewritten from scratch.

What it produces
----------------
For every fixture ``<name>`` a folder ``<out>/<name>/`` with

* ``config.json`` (and ``generation_config.json``) exactly as written by
  ``save_pretrained``;
* the weights as written by ``save_pretrained`` (safetensors; transformers 5
  has no other format), either ``model.safetensors`` or, for the sharded
  fixture, ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``;
* ``reference.npz`` with, for ``i`` in 0..3:

  - ``prompt_i``            int64 [T_i]          random token ids (T = 1, 7, 19, 40)
  - ``logprobs_i``          float32 [T_i, vocab] log_softmax of the logits at every
                            prompt position (one forward pass, no KV cache)
  - ``greedy_i``            int64 [10]           greedy continuation (EOS ignored)
  - ``greedy_logprobs_i``   float32 [10, vocab]  log_softmax of the raw logits that
                            produced each greedy token (``generate`` with KV cache)

  plus the float32 scalars ``max_abs_logprob_cache_vs_nocache`` (max |delta|
  between generate's cached step log-probs and a cache-free forward over
  prompt + greedy tokens), ``min_top2_margin`` (smallest gap between the best
  and second-best log-prob over every reference row) and
  ``min_greedy_top2_margin`` (the same over the greedy rows only).

Seeds are chosen so that the references are robust: if a seed gives a greedy
step whose top-2 gap is below MIN_GREEDY_MARGIN, any row below MIN_MARGIN, or
a greedy token equal to one of the config's ``eos_token_id`` values (so an
engine that stops at EOS still produces all 10 tokens), the next seed
``seed + 100000`` is tried. The search is deterministic.

References are always computed from the checkpoint *reloaded from disk* in
float32 with ``attn_implementation="eager"``, so the bfloat16 fixture's
reference is the bf16 weights upcast to fp32.

Determinism: every fixture has a fixed seed (weights and prompts), torch runs
single-threaded, and the output does not depend on the order fixtures are
generated in.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from tiny_checkpoint_specs import COMMON, REPO_ROOT, WEIGHT_STD, Spec, all_specs
from transformers import AutoModelForCausalLM, GenerationConfig

NEW_TOKENS = 10
PERTURB_STD = 0.1  # norms -> 1 + 0.1*randn, biases -> 0.1*randn
MIN_MARGIN = 1e-3  # smallest acceptable top-1/top-2 gap over every row
MIN_GREEDY_MARGIN = 1e-2  # ... and over the rows that pick greedy tokens
MAX_SEED_TRIES = 50

# --------------------------------------------------------------------------- helpers


def build_config(spec: Spec):
    kwargs = dict(COMMON)
    kwargs.update(spec.config_kwargs)
    config = spec.config_cls(**kwargs)
    return config


def reinitialise(model: torch.nn.Module, seed: int, spec: Spec) -> None:
    """Overwrite every parameter with well-spread, non-trivial values.

    * ``spec.init(name, param, noise)`` first, when the spec has one and it returns a tensor
    * 2-D and higher weights (Linear, Embedding, stacked experts, conv): normal(0, WEIGHT_STD)
    * RMSNorm weights (any 1-D ``*norm.weight``): 1 + PERTURB_STD * randn
    * biases: PERTURB_STD * randn

    Tied parameters are a single Parameter object and therefore drawn once.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # de-duplicates tied params
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            custom = spec.init(name, param, noise) if spec.init is not None else None
            if custom is not None:
                param.copy_(custom)
            elif name.endswith(".bias"):
                param.copy_(PERTURB_STD * noise)
            elif param.ndim == 1 and "norm" in name:
                param.copy_(1.0 + PERTURB_STD * noise)
            elif param.ndim >= 2:
                param.copy_(WEIGHT_STD * noise)
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(param.shape)}")


def make_prompts(seed: int, vocab: int, lengths: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=n, dtype=np.int64) for n in lengths]


def log_softmax(logits: torch.Tensor) -> np.ndarray:
    return torch.log_softmax(logits.to(torch.float32), dim=-1).numpy().astype(np.float32)


def top2_margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits.to(torch.float32), 2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


def check_rope(config, model) -> None:
    """Make sure a scaled RoPE really changes the frequencies at this head_dim (llama-like models
    with one ``model.rotary_emb``; families with per-layer-type or no RoPE are skipped)."""
    rope = getattr(config, "rope_parameters", None)
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or not rope or "rope_type" not in rope or not hasattr(rotary, "inv_freq"):
        return
    rope_type = rope.get("rope_type", "default")
    dim = int(config.head_dim * rope.get("partial_rotary_factor", 1.0))
    base = rope["rope_theta"]
    default = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    inv_freq = rotary.inv_freq.float()
    if rope_type == "default":
        assert torch.allclose(inv_freq, default), "default rope mismatch"
        return
    if rope_type == "linear":
        assert torch.allclose(inv_freq, default / rope["factor"]), "linear rope mismatch"
        return
    changed = ~torch.isclose(inv_freq, default, rtol=1e-6, atol=0)
    kept = int((~changed).sum())
    print(
        f"    rope {rope_type}: {int(changed.sum())}/{len(inv_freq)} inv_freq changed, "
        f"{kept} kept, attention_scaling={rotary.attention_scaling:.6f}"
    )
    assert changed.any(), f"{rope_type} scaling does not change any frequency"
    if rope_type == "llama3":
        ratio = (default / inv_freq).numpy()
        # want every regime present: 1 (high freq), strictly between, == factor
        assert np.isclose(ratio, 1.0).any(), ratio
        assert np.isclose(ratio, rope["factor"]).any(), ratio
        assert ((ratio > 1.0 + 1e-6) & (ratio < rope["factor"] - 1e-6)).any(), ratio


def disable_eos(model) -> None:
    gc: GenerationConfig = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0
    gc.bos_token_id = None
    gc.do_sample = False


def reference_for(model, prompts: list[np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    max_delta = 0.0
    margins: list[float] = []
    greedy_margins: list[float] = []
    disable_eos(model)
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            ids = torch.from_numpy(prompt)[None, :]
            logits = model(input_ids=ids, use_cache=False).logits[0]
            out[f"prompt_{i}"] = prompt.astype(np.int64)
            out[f"logprobs_{i}"] = log_softmax(logits)
            margins.append(top2_margin(logits))

            gen = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),  # token 0 == pad must not be masked
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
                use_cache=True,
            )
            new = gen.sequences[0, ids.shape[1] :]
            assert new.shape[0] == NEW_TOKENS, new.shape
            step_logits = torch.stack([lg[0] for lg in gen.logits])  # [10, vocab], raw
            assert torch.equal(step_logits.argmax(-1), new), "greedy token != argmax of its logits"
            out[f"greedy_{i}"] = new.numpy().astype(np.int64)
            out[f"greedy_logprobs_{i}"] = log_softmax(step_logits)
            margins.append(top2_margin(step_logits))
            greedy_margins.append(top2_margin(step_logits))

            # cache-free forward over prompt + greedy tokens
            full = gen.sequences[:, :-1]
            nocache = model(input_ids=full, use_cache=False).logits[0, ids.shape[1] - 1 :]
            delta = np.abs(log_softmax(nocache) - out[f"greedy_logprobs_{i}"]).max()
            max_delta = max(max_delta, float(delta))
    out["max_abs_logprob_cache_vs_nocache"] = np.float32(max_delta)
    out["min_top2_margin"] = np.float32(min(margins))
    out["min_greedy_top2_margin"] = np.float32(min(greedy_margins))
    return out


def generate_one(spec: Spec, out_dir: Path) -> dict[str, Any]:
    dest = out_dir / spec.name
    if dest.exists():
        shutil.rmtree(dest)

    for attempt in range(MAX_SEED_TRIES):
        seed = spec.seed + 100_000 * attempt
        config = build_config(spec)
        torch.manual_seed(seed)
        model_cls = spec.model_cls or AutoModelForCausalLM
        factory = model_cls.from_config if model_cls is AutoModelForCausalLM else model_cls._from_config
        model = factory(config, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        reinitialise(model, seed, spec)
        if spec.config_kwargs.get("tie_word_embeddings"):
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        check_rope(model.config, model)

        model = model.to(spec.save_dtype)
        if dest.exists():
            shutil.rmtree(dest)
        save_kwargs: dict[str, Any] = {}
        if spec.max_shard_size is not None:
            save_kwargs["max_shard_size"] = spec.max_shard_size
        model.save_pretrained(dest, **save_kwargs)
        saved_state = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
        del model

        # Reload the checkpoint from disk, in float32, and compute references from it.
        loaded = model_cls.from_pretrained(dest, dtype=torch.float32, attn_implementation="eager")
        loaded.eval()
        assert loaded.dtype == torch.float32
        loaded_state = loaded.state_dict()
        for k, v in saved_state.items():
            assert torch.equal(loaded_state[k], v), f"round-trip mismatch in {k}"
        check_rope(loaded.config, loaded)

        text_config = loaded.config.get_text_config()  # vision-language configs nest the text model's settings
        eos = getattr(text_config, "eos_token_id", None)  # Qwen3-VL's text config has none
        eos_ids = set() if eos is None else set(eos if isinstance(eos, list) else [eos])
        prompts = make_prompts(seed, text_config.vocab_size, spec.prompt_lengths)
        ref = reference_for(loaded, prompts)
        problems = []
        if float(ref["min_top2_margin"]) < MIN_MARGIN:
            problems.append(f"min top-2 margin {float(ref['min_top2_margin']):.2e}")
        if float(ref["min_greedy_top2_margin"]) < MIN_GREEDY_MARGIN:
            problems.append(f"min greedy top-2 margin {float(ref['min_greedy_top2_margin']):.2e}")
        if any(int(t) in eos_ids for i in range(len(spec.prompt_lengths)) for t in ref[f"greedy_{i}"]):
            problems.append(f"greedy continuation contains eos {sorted(eos_ids)}")
        if not problems:
            break
        print(f"    seed {seed}: {'; '.join(problems)}; trying the next seed")
    else:
        raise RuntimeError(f"{spec.name}: no acceptable seed in {MAX_SEED_TRIES} tries")

    np.savez(dest / "reference.npz", **ref)
    if spec.extra_reference is not None:
        spec.extra_reference(loaded, dest)
    for path in dest.iterdir():  # safetensors files are written 0600
        path.chmod(0o644)

    shards = sorted(p.name for p in dest.glob("*.safetensors"))
    if spec.max_shard_size is not None:
        assert len(shards) >= 2, shards
        assert (dest / "model.safetensors.index.json").exists()
    with open(dest / "config.json") as f:
        cfg = json.load(f)
    return {
        "name": spec.name,
        "seed": seed,
        "shards": shards,
        "rope": cfg.get("rope_parameters"),
        "max_delta": float(ref["max_abs_logprob_cache_vs_nocache"]),
        "margin": float(ref["min_top2_margin"]),
        "greedy_margin": float(ref["min_greedy_top2_margin"]),
        "greedy": [ref[f"greedy_{i}"].tolist() for i in range(len(spec.prompt_lengths))],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, help="write every fixture into this folder instead of its package's")
    parser.add_argument("--only", action="append", default=[], help="fixture name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the fixtures and their folders, generate nothing")
    args = parser.parse_args(argv)

    targets = all_specs()
    known = {target.spec.name for target in targets}
    unknown = set(args.only) - known
    if unknown:
        parser.error(f"unknown fixture(s): {sorted(unknown)}; known: {sorted(known)}")
    targets = [t for t in targets if not args.only or t.spec.name in args.only]
    if args.list:
        for target in targets:
            root = args.out or target.root
            print(f"{target.spec.name}\t{os.path.relpath(root / target.spec.name, REPO_ROOT)}")
        return 0

    if not transformers.__version__.startswith("5.23."):
        print(
            f"warning: fixtures were made with transformers 5.23.*, found {transformers.__version__}",
            file=sys.stderr,
        )
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    for target in targets:
        spec, out_dir = target.spec, args.out or target.root
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"== {spec.name} -> {out_dir / spec.name}")
        info = generate_one(spec, out_dir)
        print(
            f"    seed={info['seed']} shards={info['shards']} "
            f"cache-vs-nocache={info['max_delta']:.2e} min-top2-margin={info['margin']:.4f} "
            f"greedy={info['greedy_margin']:.4f}"
        )
        print(f"    rope_parameters={json.dumps(info['rope'])}")
        if not math.isfinite(info["max_delta"]) or info["max_delta"] > 1e-4:
            raise RuntimeError(f"{spec.name}: HF cache/no-cache mismatch {info['max_delta']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
