"""The peer of `atlas bench latency --random-weights`: Hugging Face transformers ``generate`` on the same
model shape with random bf16 weights on the GPU, batch 1, greedy, a fixed number of new tokens.

A development tool for docs/benchmarks.md (torch and transformers are never Atlas dependencies).
Usage: python hf_peer.py llama-3-8b [--prompt-len 32] [--tokens 128] [--attn sdpa|eager] [--num-layers N]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from atlas_core.bench.random_weights import cut_layers, load_config, text_config


def timed_generate(model: torch.nn.Module, ids: torch.Tensor, tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--num-layers", type=int, default=None, help="keep the first N layers (as atlas bench's flag)")
    args = parser.parse_args()
    name, config_dict = load_config(args.model)
    if args.num_layers is not None:
        config_dict = cut_layers(config_dict, args.num_layers)
        name = f"{name}, {args.num_layers} layers"
    config = AutoConfig.for_model(**text_config(config_dict))  # a vision-language config's language model
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16, attn_implementation=args.attn)
    model.eval()
    ids = torch.randint(0, config.vocab_size, (1, args.prompt_len), device="cuda")
    with torch.inference_mode():
        timed_generate(model, ids, 4)  # warm-up
        first = min(timed_generate(model, ids, 1) for _ in range(3))
        total = timed_generate(model, ids, args.tokens)
    decode = (args.tokens - 1) / (total - first)
    print(
        f"transformers {__import__('transformers').__version__} torch {torch.__version__} "
        f"{torch.cuda.get_device_name()}: "
        f"{name} bf16 attn={args.attn}, batch 1, {args.prompt_len}-token prompt: first token {1e3 * first:.1f} ms, "
        f"decode {decode:.1f} tok/s ({args.tokens} tokens in {total:.2f} s)"
    )


if __name__ == "__main__":
    main()
