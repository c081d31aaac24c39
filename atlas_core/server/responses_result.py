"""Finishing a Responses API response: status, usage and the store.

`ResponseContext` carries what a response needs besides the engine output: the response object as
it starts (``in_progress``, no output), the parsers, and where to keep it (``store``). `finalize`
fills in the output items, ``status`` (``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` when the token limit cut the answer), ``usage`` and ``completed_at``, and
stores the response with its conversation. `whole_response` is the non-streamed answer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from atlas_core.engine.outputs import RequestOutput
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.responses_output import OutputItems, assistant_turn
from atlas_core.server.responses_store import ResponseStore, StoredResponse
from atlas_core.server.schemas_responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseObject,
    ResponseUsage,
)
from atlas_core.tokenizer import Tokenizer

log = logging.getLogger("atlas.server")


@dataclass
class ResponseContext:
    """``base``: the response as created (status ``in_progress``); ``conversation``: the messages
    it answers, without instructions; ``store``: None unless the request asked to be stored."""

    base: ResponseObject
    parsers: ParserSpec
    tokenizer: Tokenizer
    conversation: list[dict[str, Any]]
    store: ResponseStore | None


def usage_of(output: RequestOutput, reasoning: str, tokenizer: Tokenizer) -> ResponseUsage:
    """Token counts; ``reasoning_tokens`` counts the reasoning text's tokens (markers excluded)."""
    prompt = len(output.prompt_token_ids)
    generated = len(output.outputs[0].token_ids)
    reasoning_tokens = len(tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    return ResponseUsage(
        input_tokens=prompt,
        output_tokens=generated,
        total_tokens=prompt + generated,
        input_tokens_details=InputTokensDetails(cached_tokens=output.num_cached_tokens),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=min(reasoning_tokens, generated)),
    )


def finalize(ctx: ResponseContext, output: RequestOutput, built: OutputItems) -> ResponseObject:
    """The finished response of ``output`` with ``built``'s items; stored when asked."""
    incomplete = output.outputs[0].finish_reason == "length"
    response = msgspec.structs.replace(
        ctx.base,
        status="incomplete" if incomplete else "completed",
        output=list(built.items),
        usage=usage_of(output, built.reasoning, ctx.tokenizer),
        incomplete_details=IncompleteDetails("max_output_tokens") if incomplete else None,
        completed_at=None if incomplete else int(time.time()),
    )
    if ctx.store is not None:
        messages = [*ctx.conversation, *assistant_turn(response.output)]
        ctx.store.put(StoredResponse(response, messages))
    return response


def whole_response(output: RequestOutput, ctx: ResponseContext) -> ResponseObject:
    """The non-streamed response: the completion's text parsed at once into output items."""
    completion = output.outputs[0]
    parser = ctx.parsers.new()
    built = OutputItems()
    built.feed(parser.feed(completion.text))
    events, message = parser.finish()
    built.feed(events)
    built.finish(incomplete=completion.finish_reason == "length")
    if message.problems:
        log.info("tool-call output kept as text: %s", "; ".join(message.problems))
    return finalize(ctx, output, built)
