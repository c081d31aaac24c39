"""Streaming detokenization: token ids in, text deltas out.

Decoding token by token is wrong for most tokenizers: a byte-level BPE token may hold part of a
UTF-8 character, a SentencePiece byte-fallback token (``<0xE4>``) is one byte of a character, and
SentencePiece decoders strip the leading space of the first token they see. So each step decodes
a short window of recent tokens twice, as vLLM and TGI do: once up to ``read_offset`` (text
already emitted, with ``prefix_offset`` tokens of left context) and once to the end. The
difference is the new text, and it is held back while it ends in U+FFFD, which the decoders
produce for an incomplete byte sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

from atlas_core.tokenizer.tokenizer import Tokenizer

# Prompt tokens kept as left context for the first generated token (enough for a 4-byte
# character split into single-byte tokens, plus one token for leading-space handling).
_PROMPT_CONTEXT = 5

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas. Never emits a partial UTF-8 character
    (U+FFFD from an incomplete byte sequence is held back until the next tokens complete it),
    handles SentencePiece leading-space / byte-fallback and byte-level BPE correctly by decoding
    a sliding window (prefix offset / read offset technique as in vLLM/TGI) rather than
    token-by-token.

    `prompt_ids` give the left context of the first generated token (only their last few are
    used); their text is never emitted. With an empty prompt, the concatenated deltas equal
    ``tokenizer.decode(generated_ids)`` for the tokenizers Atlas supports.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far by `push` and `flush`."""
        return "".join(self._parts)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes (possibly "")."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At end of stream, emit anything held back (even if it ends in U+FFFD)."""
        return self._advance(final=True)

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)

    def _advance(self, *, final: bool) -> str:
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or (not final and new_text.endswith(_REPLACEMENT)):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Tokens before the new prefix are never decoded again.
        del self._ids[: self._prefix_offset]
        self._read_offset -= self._prefix_offset
        self._prefix_offset = 0
        self._parts.append(delta)
        return delta


__all__ = ["IncrementalDetokenizer"]
