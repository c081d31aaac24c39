"""Engine logprobs (`PositionLogprobs`) -> OpenAI's chat and completions logprob objects."""

from __future__ import annotations

from collections.abc import Sequence

from atlas_core.engine.outputs import Logprob, PositionLogprobs
from atlas_core.server.schemas_openai import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob
from atlas_core.tokenizer import Tokenizer


class TokenTexts:
    """Each token id's own text (special tokens included) and its UTF-8 bytes, cached."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text


def _top(position: PositionLogprobs, count: int) -> list[tuple[int, Logprob]]:
    """The ``count`` most likely entries of a position, best first (the chosen token is kept
    only when it ranks among them)."""
    return sorted(position.items(), key=lambda item: (item[1].rank, item[0]))[:count]


def chat_logprobs(
    positions: Sequence[PositionLogprobs], token_ids: Sequence[int], top: int, texts: TokenTexts
) -> ChatLogprobs:
    """``choices[].logprobs`` of a chat completion for generated ``token_ids``."""
    content = []
    for position, token in zip(positions, token_ids, strict=False):
        text = texts.text(token)
        content.append(
            TokenLogprob(
                token=text,
                logprob=position[token].logprob,
                bytes=list(text.encode()),
                top_logprobs=[
                    TopLogprob(texts.text(t), entry.logprob, list(texts.text(t).encode()))
                    for t, entry in _top(position, top)
                ],
            )
        )
    return ChatLogprobs(content)


def completion_logprobs(
    positions: Sequence[PositionLogprobs | None], token_ids: Sequence[int], top: int, texts: TokenTexts, offset: int
) -> CompletionLogprobs:
    """``choices[].logprobs`` of a text completion; ``offset`` is where the first token's text
    starts in the choice's text. A None position (the first prompt token) has no logprob."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for position, token in zip(positions, token_ids, strict=False):
        text = texts.text(token)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if position is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(position[token].logprob)
        out.top_logprobs.append({texts.text(t): entry.logprob for t, entry in _top(position, top)} if top else None)
    return out
