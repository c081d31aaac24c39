"""``atlas generate`` (one prompt, streamed to stdout) and ``atlas chat`` (interactive)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from atlas_core.engine.config import ENGINE_OPTIONS
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.options.flags import add_flags, parsed_values


def _llm(args: argparse.Namespace) -> Any:
    from atlas_core.engine.llm import LLM

    return LLM(**parsed_values(args, ENGINE_OPTIONS))


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Sampling flags of ``generate`` and ``chat``."""
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default: 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0 = off)")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (default: 0 = off)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: none)")


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )


def _stream(llm: Any, prompt: str, prompt_ids: list[int], params: SamplingParams) -> str:
    """Generate one completion, printing text as it arrives; returns the full text."""
    engine = llm.engine
    request_id = f"cli-{id(prompt_ids)}"
    engine.add_request(request_id, prompt, prompt_ids, params)
    shown = 0
    text = ""
    try:
        while engine.has_unfinished():
            for output in engine.step():
                text = output.outputs[0].text
                print(text[shown:], end="", flush=True)
                shown = len(text)
    finally:
        engine.abort(request_id)
    print()
    return text


def run_generate(args: argparse.Namespace) -> int:
    llm = _llm(args)
    prompt = args.prompt
    if args.chat:
        prompt = llm.require_tokenizer().apply_chat_template([{"role": "user", "content": prompt}])
        ids = llm.require_tokenizer().encode(prompt, add_special_tokens=False)
    else:
        ids = llm.require_tokenizer().encode(prompt)
    _stream(llm, prompt, ids, _params(args))
    return 0


def run_chat(args: argparse.Namespace) -> int:
    llm = _llm(args)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    print(f"Chatting with {llm.loaded.name} on {llm.backend.name}. Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input(">>> ").strip()
        except EOFError:
            print()
            return 0
        if not line:
            return 0
        messages.append({"role": "user", "content": line})
        prompt = llm.require_tokenizer().apply_chat_template(messages)
        reply = _stream(llm, prompt, llm.require_tokenizer().encode(prompt, add_special_tokens=False), _params(args))
        messages.append({"role": "assistant", "content": reply})


def add_generate_parser(commands: Any) -> None:
    parser = commands.add_parser("generate", help="complete one prompt and print the result")
    add_flags(parser, ENGINE_OPTIONS)
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template as a user message"
    )
    add_sampling_args(parser)
    parser.set_defaults(handler=run_generate)


def add_chat_parser(commands: Any) -> None:
    parser = commands.add_parser("chat", help="chat with a model in the terminal")
    add_flags(parser, ENGINE_OPTIONS)
    parser.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(parser)
    parser.set_defaults(handler=run_chat)
