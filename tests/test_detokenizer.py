"""Incremental detokenization (`IncrementalDetokenizer`) over the in-memory tokenizers: streamed text equals the
full decode, partial characters are held back, and special tokens are skipped or kept."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as Backend

from atlas_core.tokenizer import IncrementalDetokenizer
from tests.tokenizer_backends import make

MULTIBYTE_TEXTS = ["Atlas 😀 says 世界 and 🎉!", "日本語のテキスト", "é😀x👍🏽y", "🇫🇷 Paris ½ ∑ 中"]


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids]


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_byte_level_stream_matches_full_decode(byte_backend: Backend, text: str) -> None:
    tok = make(byte_backend)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # multi-byte characters really are split across tokens
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids)
    assert "" in deltas  # partial characters were held back...
    assert all("\ufffd" not in d for d in deltas)  # ...and never emitted
    assert detok.flush() == ""
    assert "".join(deltas) == detok.text == tok.decode(ids) == text


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_stream_after_prompt(byte_backend: Backend, text: str) -> None:
    tok = make(byte_backend)
    prompt = tok.encode("The quick brown 😀", add_special_tokens=False)
    ids = tok.encode(" " + text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = stream(detok, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert detok.text == " " + text


def test_sentencepiece_leading_space_and_byte_fallback(sp_backend: Backend) -> None:
    tok = make(sp_backend, add_bos_token=False)
    ids = tok.encode("hello wörld 世", add_special_tokens=False)
    assert "<0xC3>" in [tok.token_to_str(i) for i in ids]
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids)
    assert deltas[:2] == ["hello", " "]
    assert all("\ufffd" not in d for d in deltas)
    assert detok.text == tok.decode(ids) == "hello wörld 世"
    after_prompt = IncrementalDetokenizer(tok, tok.encode("hello"))
    assert stream(after_prompt, ids)[0] == " hello"  # a word after the prompt keeps its space


def test_flush_emits_incomplete_character(byte_backend: Backend) -> None:
    tok = make(byte_backend)
    ids = tok.encode("ok 😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    assert "".join(stream(detok, ids[:-2])) == "ok "
    tail = detok.flush()
    assert tail and tail.endswith("\ufffd")
    assert detok.text == "ok " + tail


def test_special_tokens_in_stream(byte_backend: Backend) -> None:
    tok = make(byte_backend)
    ids = [*tok.encode("Hello", add_special_tokens=False), byte_backend.token_to_id("</s>")]
    skipped = IncrementalDetokenizer(tok)
    assert stream(skipped, ids)[-1] == "" and skipped.text == "Hello"
    kept = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert stream(kept, ids)[-1] == "</s>" and kept.text == "Hello</s>"
