"""Request fields -> `SamplingParams`, with the length checks every endpoint shares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import InvalidRequestError
from atlas_core.server.errors import APIError, invalid
from atlas_core.server.schemas_openai import SamplerFields
from atlas_core.server.state import ServerConfig
from atlas_core.tokenizer.tokenizer import Tokenizer


def check_prompt_length(num_tokens: int, max_seq_len: int, *, param: str = "messages") -> None:
    """400 unless at least one token of room remains after the prompt (``param``: the field holding it)."""
    if num_tokens == 0:
        raise invalid("the prompt is empty; send at least one token of text")
    if num_tokens >= max_seq_len:
        raise invalid(
            f"prompt too long: {num_tokens} tokens > {max_seq_len - 1} (max_seq_len {max_seq_len} minus one token "
            "for the answer); shorten the prompt or start the server with a larger --max-seq-len",
            param=param,
        )


def check_text_chars(tokenizer: Tokenizer, chars: int, tokens: int, *, param: str = "messages") -> None:
    """400 before tokenizing a text of ``chars`` characters that cannot fit in ``tokens`` tokens (more than
    `Tokenizer.max_text_chars`), so that a flood of text is refused at once instead of holding the tokenizer
    (and, through the interpreter lock, the server) for many seconds."""
    if chars > tokenizer.max_text_chars(tokens):
        raise invalid(
            f"prompt too long: its {chars} characters cannot fit in the {tokens} tokens the context leaves; shorten "
            "it or start the server with a larger --max-seq-len",
            param=param,
        )


def check_max_tokens(max_tokens: int | None, max_seq_len: int, *, param: str = "max_tokens") -> None:
    """400 for a ``max_tokens`` below 1 or beyond the whole context (no prompt could leave that room)."""
    if max_tokens is None:
        return
    if max_tokens < 1:
        raise invalid(f"{param} must be at least 1, got {max_tokens}", param=param)
    if max_tokens > max_seq_len:
        raise invalid(
            f"{param}={max_tokens} is more than the model's context (max_seq_len {max_seq_len}); ask for at most "
            f"{max_seq_len} minus the prompt's tokens",
            param=param,
        )


def check_sequences(config: ServerConfig, num_prompts: int, n: int) -> None:
    """400 when ``num_prompts`` prompts of ``n`` completions each exceed ``max_sequences_per_request``
    (checked before anything is tokenized)."""
    limit = config.max_sequences_per_request
    if num_prompts * n > limit:
        asked = f"{num_prompts} prompts times n={n}" if num_prompts > 1 else f"n={n}"
        raise invalid(
            f"this request asks for {num_prompts * n} completions ({asked}); this server accepts at most {limit} per "
            "request (--max-sequences-per-request): send fewer prompts or a smaller n",
            param="n",
        )


def check_request_work(
    config: ServerConfig, prompt_lengths: list[int], n: int, max_tokens: int | None, max_seq_len: int
) -> None:
    """400 when the work a request may create exceeds the server's per-request limits: its
    completions (prompts times ``n``, `check_sequences`), and its tokens: every prompt's tokens plus,
    for each of its ``n`` completions, the tokens it may generate (``max_tokens``, at most the rest of
    the context; None: the rest of the context)."""
    check_sequences(config, len(prompt_lengths), n)
    total = sum(length + n * min(max_tokens or max_seq_len, max_seq_len - length) for length in prompt_lengths)
    limit = config.max_tokens_per_request
    if total > limit:
        raise invalid(
            f"this request may create up to {total} tokens (prompt tokens plus n={n} completions of up to "
            f"{'max_tokens' if max_tokens else 'the rest of the context'} each); this server accepts at most {limit} "
            "per request (--max-tokens-per-request): set a smaller max_tokens, n or fewer prompts",
            param="max_tokens",
        )


def logit_bias_of(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys) with integer keys."""
    out = {}
    for key, value in (bias or {}).items():
        try:
            out[int(key)] = value
        except ValueError:
            raise invalid(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
    return out


def sampling_params(
    fields: SamplerFields, *, max_tokens: int | None, defaults: Mapping[str, Any] | None = None, **extra: Any
) -> SamplingParams:
    """`SamplingParams` from the shared sampler fields; ``extra`` adds or overrides fields
    (``logprobs``, ``prompt_logprobs``, structured-output settings). ``defaults`` (the model's
    ``generation_config.json`` values, `ServerConfig.generation_defaults`) stand in for sampler
    fields the request leaves out: request > ``defaults`` > `SamplingParams`'s built-in defaults.
    Out-of-range values: 400."""
    if fields.seed is not None and fields.seed < 0:
        raise invalid(f"seed must be a non-negative integer, got {fields.seed}", param="seed")
    kwargs: dict[str, Any] = dict(defaults or {})
    kwargs |= {
        name: getattr(fields, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "top_n_sigma",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        )
        if getattr(fields, name) is not None
    }
    kwargs.update(
        n=fields.n,
        max_tokens=max_tokens,
        min_tokens=fields.min_tokens,
        seed=fields.seed,
        stop=fields.stop,
        stop_token_ids=list(fields.stop_token_ids or []),
        logit_bias=logit_bias_of(fields.logit_bias),
        ignore_eos=fields.ignore_eos,
        include_stop_str_in_output=fields.include_stop_str_in_output,
        skip_special_tokens=fields.skip_special_tokens,
    )
    kwargs.update(extra)
    try:
        return SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        raise APIError(400, str(exc)) from None
