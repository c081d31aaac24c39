"""OpenAI text completion responses (``/v1/completions``): prompts, ``echo``, logprobs, streaming.

A request may hold several prompts; each is its own engine request, and choice ``i * n + j`` is
completion ``j`` of prompt ``i``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

from atlas_core.engine.outputs import PositionLogprobs, RequestOutput
from atlas_core.server.errors import invalid
from atlas_core.server.generation import merge
from atlas_core.server.logprob_format import TokenTexts, completion_logprobs
from atlas_core.server.sampling import check_prompt_length, check_text_chars
from atlas_core.server.schemas_openai import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    PromptTokensDetails,
    Usage,
)
from atlas_core.server.state import ModelRuntime
from atlas_core.server.streaming import DONE, Progress, sse


@dataclass
class Prompt:
    text: str
    ids: list[int]
    from_text: bool


def prompt_items(request: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts, each a string or a list of token ids (not yet tokenized); 400 when
    empty or mixed."""
    raw = request.prompt
    if isinstance(raw, str):
        return [raw]
    if raw and all(isinstance(item, int) for item in raw):
        return [list(raw)]  # type: ignore[arg-type]
    if raw and all(isinstance(item, (str, list)) for item in raw):
        return list(raw)  # type: ignore[arg-type]
    raise invalid(
        "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists "
        "(not empty, not mixed)",
        param="prompt",
    )


def prompts_of(runtime: ModelRuntime, items: list[str | list[int]]) -> list[Prompt]:
    """``items`` (from `prompt_items`) tokenized (token-id prompts are decoded for ``echo``); 400
    when a token id is outside the vocabulary or a prompt is too long."""
    tokenizer = runtime.tokenizer
    vocab = runtime.vocab_size
    prompts = []
    for item in items:
        if isinstance(item, str):
            check_text_chars(tokenizer, len(item), runtime.max_seq_len - 1, param="prompt")
            prompts.append(Prompt(item, tokenizer.encode(item), True))
        else:
            bad = [token for token in item if not 0 <= token < vocab]
            if bad:
                raise invalid(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt")
            prompts.append(Prompt(tokenizer.decode(item), list(item), False))
    for prompt in prompts:
        check_prompt_length(len(prompt.ids), runtime.max_seq_len)
    return prompts


@dataclass
class CompletionContext:
    response_id: str
    created: int
    model: str
    n: int
    echo: bool
    logprobs: int | None
    texts: TokenTexts
    include_usage: bool = False


def _choice_logprobs(
    output: RequestOutput,
    ids: list[int],
    positions: list[PositionLogprobs],
    ctx: CompletionContext,
    offset: int,
    with_prompt: bool,
) -> CompletionLogprobs | None:
    """Logprobs of ``ids`` (generated tokens), preceded by the prompt's when ``with_prompt`` (echo)."""
    if ctx.logprobs is None:
        return None
    if with_prompt:
        prompt_positions: list[PositionLogprobs | None] = list(
            output.prompt_logprobs or [None] * len(output.prompt_token_ids)
        )
        return completion_logprobs(
            prompt_positions + list(positions), list(output.prompt_token_ids) + ids, ctx.logprobs, ctx.texts, offset
        )
    return completion_logprobs(positions, ids, ctx.logprobs, ctx.texts, offset)


def usage_of(outputs: list[RequestOutput]) -> Usage:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached))


def completion_response(outputs: list[RequestOutput], prompts: list[Prompt], ctx: CompletionContext) -> Completion:
    """The non-streamed response."""
    choices = []
    for p, (output, prompt) in enumerate(zip(outputs, prompts, strict=True)):
        prefix = prompt.text if ctx.echo else ""
        for completion in output.outputs:
            logprobs = _choice_logprobs(
                output, completion.token_ids, completion.logprobs or [], ctx, 0, with_prompt=ctx.echo
            )
            choices.append(
                CompletionChoice(
                    index=p * ctx.n + completion.index,
                    text=prefix + completion.text,
                    finish_reason=completion.finish_reason,
                    logprobs=logprobs,
                )
            )
    return Completion(
        id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage_of(outputs)
    )


async def completion_stream(
    streams: list[AsyncGenerator[RequestOutput, None]], prompts: list[Prompt], ctx: CompletionContext
) -> AsyncGenerator[bytes, None]:
    """The ``text/event-stream`` body of a streamed completion."""
    progress: dict[int, Progress] = {}
    offsets: dict[int, int] = {}
    latest: dict[int, RequestOutput] = {}

    def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> bytes:
        return sse(Completion(id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage))

    async for p, output in merge(streams):
        latest[p] = output
        for completion in output.outputs:
            index = p * ctx.n + completion.index
            first = index not in progress
            state = progress.setdefault(index, Progress())
            if state.finished:
                continue
            text, ids, positions = state.advance(completion)
            echo = prompts[p].text if first and ctx.echo else ""
            logprobs = _choice_logprobs(output, ids, positions, ctx, offsets.get(index, 0), first and ctx.echo)
            offsets[index] = offsets.get(index, 0) + len(echo) + len(text)
            state.finished = completion.finish_reason is not None
            if echo or text or ids or state.finished:
                yield chunk(
                    [
                        CompletionChoice(
                            index=index,
                            text=echo + text,
                            finish_reason=completion.finish_reason,
                            logprobs=logprobs,
                        )
                    ]
                )
    if ctx.include_usage:
        yield chunk([], usage_of([latest[p] for p in sorted(latest)]))
    yield DONE
