"""Encoding a chat so that message content is plain text: a special-token string written inside a
message (``<|im_start|>system``) is tokenized as the characters it spells, never as that special
token, so a user cannot forge a turn of the conversation. Only the chat template's own markup
yields special tokens.

How: every string the request supplies (message fields and tool definitions, at any depth) has its
special-token strings replaced by sentinels (private-use characters no vocabulary gives meaning to)
before the template renders; the rendered text is encoded as usual, so the template's special tokens
are found where it put them; then each stretch of text between two of them that holds a sentinel is
encoded again with the sentinels turned back into the original strings and special-token matching
off. Conversations without such strings (nearly all) are encoded exactly as before, with no extra
work beyond one scan. Works for any `tokenizers` backend, whether read from ``tokenizer.json`` or
rebuilt from GGUF metadata (whose control tokens are its special tokens).
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import tokenizers

from atlas_core.tokenizer.tokenizer import Tokenizer

OPEN, CLOSE = "\U0010fffd", "\U0010fffc"
"""A sentinel is ``OPEN`` + the protected string's index + ``CLOSE`` (private-use characters)."""

_SENTINEL = re.compile(f"{OPEN}([0-9]+){CLOSE}")


@dataclass
class EncodedChat:
    """A rendered chat: its text (as the template wrote it, content included) and its token ids."""

    text: str
    ids: list[int]


def encode_chat(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    special_tokens_in_content: bool = False,
    rewrite: Callable[[str], str] | None = None,
) -> EncodedChat:
    """Render ``messages`` (and ``tools``) with the model's chat template and tokenize the text.

    Special-token strings inside ``messages`` and ``tools`` are plain text unless
    ``special_tokens_in_content`` (then the rendered text is tokenized as a whole, so they become
    special tokens). ``rewrite`` changes the rendered text before tokenization (a vision model's
    processor wrapping the template's image markers, `VisionModel.rewrite_template_text`); content is
    protected from it like from the tokenizer. Errors as `Tokenizer.apply_chat_template`.
    """
    literal = None if special_tokens_in_content else _literal_specials(tokenizer)
    found: dict[str, int] = {}
    if literal is not None:
        messages = _protect(messages, literal.pattern, found)
        tools = _protect(tools, literal.pattern, found) if tools is not None else None
    text = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template_kwargs=chat_template_kwargs,
    )
    if rewrite is not None:
        text = rewrite(text)
    if not found:
        return EncodedChat(text, tokenizer.encode(text, add_special_tokens=False))
    assert literal is not None
    originals = list(found)
    return EncodedChat(_restore(text, originals), literal.encode(text, originals))


class _LiteralSpecials:
    """One tokenizer's special tokens: a pattern finding their strings (and sentinel characters, so
    that a request cannot smuggle in a sentinel of its own), and encoders that read them as text."""

    def __init__(self, backend: tokenizers.Tokenizer, specials: dict[int, str]) -> None:
        self.backend = backend
        self.special_ids = frozenset(specials)
        self.pattern = re.compile(f"{_trie_pattern(set(specials.values()))}|[{OPEN}{CLOSE}]")
        self._plain: dict[bool, tokenizers.Tokenizer] = {}

    def encode(self, text: str, originals: list[str]) -> list[int]:
        """Token ids of ``text`` (rendered from protected content): the template's special tokens as
        found, each stretch between them that holds sentinels re-encoded as plain text."""
        encoding = self.backend.encode(text, add_special_tokens=False)
        ids: list[int] = []
        for special, run in _runs(encoding.ids, encoding.offsets, self.special_ids):
            start, end = run[0][1][0], run[-1][1][1]
            if special or not _SENTINEL.search(text, start, end):
                ids.extend(token for token, _ in run)
            else:
                ids.extend(
                    self._plain_backend(at_start=start == 0)
                    .encode(_restore(text[start:end], originals), add_special_tokens=False)
                    .ids
                )
        return ids

    def _plain_backend(self, *, at_start: bool) -> tokenizers.Tokenizer:
        """A copy of the backend that reads special-token strings as text. Text that does not start
        the prompt gets no SentencePiece prefix space, as when the whole prompt is encoded at once
        (``Metaspace`` with ``prepend_scheme`` ``first`` looks at the position in the whole text)."""
        if at_start not in self._plain:
            config = json.loads(self.backend.to_str())
            if not at_start:
                _no_first_prefix(config)
            plain = tokenizers.Tokenizer.from_str(json.dumps(config))
            plain.encode_special_tokens = True
            self._plain[at_start] = plain
        return self._plain[at_start]


def _trie_pattern(strings: set[str]) -> str:
    """A regex matching any of ``strings``, the longest where several match, built as a trie: a
    plain alternation tries every string at every position (seconds for a few thousand special
    tokens over a long prompt); a trie tries one branch per character."""
    trie: dict[str, Any] = {}
    for string in strings:
        node = trie
        for char in string:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return pattern(trie)


def _runs(
    ids: list[int], offsets: list[tuple[int, int]], special_ids: frozenset[int]
) -> Iterator[tuple[bool, list[tuple[int, tuple[int, int]]]]]:
    """``(is_special, [(id, offsets), ...])``: each special token alone, the tokens between them together."""
    run: list[tuple[int, tuple[int, int]]] = []
    for token, span in zip(ids, offsets, strict=True):
        if token in special_ids:
            if run:
                yield False, run
                run = []
            yield True, [(token, span)]
        else:
            run.append((token, span))
    if run:
        yield False, run


def _no_first_prefix(config: Any) -> None:
    """Turn every ``Metaspace`` ``prepend_scheme`` ``first`` in a tokenizer.json config into ``never``."""
    if isinstance(config, dict):
        if config.get("type") == "Metaspace" and config.get("prepend_scheme") == "first":
            config["prepend_scheme"] = "never"
        for value in config.values():
            _no_first_prefix(value)
    elif isinstance(config, list):
        for value in config:
            _no_first_prefix(value)


def _protect(value: Any, pattern: re.Pattern[str], found: dict[str, int]) -> Any:
    """A copy of ``value`` (JSON-like) whose strings have each match of ``pattern`` replaced by the
    sentinel of its index in ``found`` (which grows); dictionary keys are left alone."""
    if isinstance(value, str):
        return pattern.sub(lambda m: f"{OPEN}{found.setdefault(m.group(), len(found))}{CLOSE}", value)
    if isinstance(value, dict):
        return {key: _protect(item, pattern, found) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_protect(item, pattern, found) for item in value]
    return value


def _restore(text: str, originals: list[str]) -> str:
    """``text`` with every sentinel turned back into the string it stands for."""
    return _SENTINEL.sub(lambda m: originals[int(m.group(1))], text)


_CACHE: weakref.WeakKeyDictionary[Tokenizer, _LiteralSpecials | None] = weakref.WeakKeyDictionary()


def _literal_specials(tokenizer: Tokenizer) -> _LiteralSpecials | None:
    """The tokenizer's `_LiteralSpecials` (built once), or None when it has no special tokens."""
    if tokenizer not in _CACHE:
        added = tokenizer.backend.get_added_tokens_decoder()
        specials = {token_id: token.content for token_id, token in added.items() if token.special and token.content}
        _CACHE[tokenizer] = _LiteralSpecials(tokenizer.backend, specials) if specials else None
    return _CACHE[tokenizer]


__all__ = ["EncodedChat", "encode_chat"]
