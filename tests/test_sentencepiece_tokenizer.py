"""Folders whose only tokenizer is a SentencePiece ``tokenizer.model``: small models trained here with
the ``sentencepiece`` library are loaded through `Tokenizer.from_folder` and must encode and decode
as ``sentencepiece`` does, keep control and user-defined pieces whole, take ``tokenizer_config.json``
on top, refuse what they cannot reproduce, and serve a tiny checkpoint end to end."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm

from atlas_core.errors import ModelLoadError
from atlas_core.model.resolve import HUB_PATTERNS
from atlas_core.tokenizer import Tokenizer
from tests.conftest import TINY

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there! How are you today?",
    "Tokenizers split text into pieces; SentencePiece treats spaces as symbols.",
    "Numbers like 12345 and 3.14 appear too.",
    "def add(a, b):\n    return a + b",
    "Café, naïve, résumé: accents matter.",
]
SAMPLES = [
    "Hello world",
    "two  spaces and a tab\there",
    "trailing space ",
    "new\nline\n\nand more",
    "Café naïve résumé",
    "emoji 😀 and ✓ and 日本語",
    "unseen Zyxq words",
    "a",
    "",
]
"""Texts to compare (none begins with a space: there Atlas writes one ``▁`` where sentencepiece
writes two, as the GGUF SentencePiece path does)."""


def train(folder: Path, **options: object) -> spm.SentencePieceProcessor:
    """Train a small model on `CORPUS` into ``folder/tokenizer.model``; its processor."""
    settings: dict[str, object] = {
        "model_type": "bpe",
        "vocab_size": 400,
        "character_coverage": 1.0,
        "normalization_rule_name": "identity",
        "remove_extra_whitespaces": False,
        "byte_fallback": True,
        "minloglevel": 2,
        **options,
    }
    written = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 10), model_writer=written, **settings)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(written.getvalue())
    return spm.SentencePieceProcessor(model_proto=written.getvalue())


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, spm.SentencePieceProcessor]:
    folder = tmp_path_factory.mktemp("sp-bpe")
    return folder, train(folder, user_defined_symbols=["<think>"], control_symbols=["<|im_end|>"])


def load(folder: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_folder(folder)
    assert tokenizer is not None
    return tokenizer


@pytest.mark.parametrize("options", [{}, {"byte_fallback": False}, {"add_dummy_prefix": False}])
def test_encodes_and_decodes_as_sentencepiece(tmp_path: Path, options: dict[str, object]) -> None:
    processor = train(tmp_path, **options)
    tokenizer = load(tmp_path)
    assert tokenizer.vocab_size == processor.vocab_size()
    for text in SAMPLES:
        expected = [processor.bos_id(), *processor.encode(text)]
        assert tokenizer.encode(text) == expected, text
        if options.get("byte_fallback", True):  # without byte pieces unknown text decodes as <unk>, not " ⁇ "
            assert tokenizer.decode(expected) == processor.decode(expected), text


def test_special_pieces_and_ids(trained: tuple[Path, spm.SentencePieceProcessor]) -> None:
    folder, processor = trained
    tokenizer = load(folder)
    assert tokenizer.bos_token_id == processor.bos_id() == 1
    # EOS, then the control pieces that end generation by name (as for GGUF files)
    assert tokenizer.eos_token_ids == [processor.eos_id(), processor.piece_to_id("<|im_end|>")]
    assert tokenizer.add_bos_token is True
    assert tokenizer.special_token_strings == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    think, im_end = processor.piece_to_id("<think>"), processor.piece_to_id("<|im_end|>")
    ids = tokenizer.encode("Hello<think>x<|im_end|>", add_special_tokens=False)
    assert think in ids and im_end in ids  # one id each, not spelled out
    assert tokenizer.decode(ids) == "Hello<think>x"  # the control piece is special: skipped
    assert tokenizer.decode(ids, skip_special_tokens=False) == "Hello<think>x<|im_end|>"


def test_tokenizer_config_applies_on_top(tmp_path: Path) -> None:
    processor = train(tmp_path, control_symbols=["<|im_start|>", "<|im_end|>"])
    (tmp_path / "tokenizer_config.json").write_text(
        '{"add_bos_token": false, "eos_token": "<|im_end|>", '
        '"chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"}'
    )
    tokenizer = load(tmp_path)
    assert tokenizer.add_bos_token is False
    assert tokenizer.eos_token_ids == [processor.piece_to_id("<|im_end|>")]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hello world"}], add_generation_prompt=False)
    assert prompt == "<|im_start|>Hello world<|im_end|>"
    assert tokenizer.encode(prompt)[0] == processor.piece_to_id("<|im_start|>")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model_type": "unigram", "hard_vocab_limit": False}, "unigram models are not supported"),
        ({"normalization_rule_name": "nmt_nfkc"}, "rewrites text"),
        ({"remove_extra_whitespaces": True}, "rewrites text"),
    ],
)
def test_models_it_cannot_reproduce_are_refused(tmp_path: Path, options: dict[str, object], message: str) -> None:
    train(tmp_path, **options)
    with pytest.raises(ModelLoadError, match=message) as raised:
        Tokenizer.from_folder(tmp_path)
    assert str(tmp_path / "tokenizer.model") in str(raised.value)


@pytest.mark.parametrize("content", [b"", b"not a protobuf \xff\xff\xff"])
def test_a_file_that_is_not_a_sentencepiece_model_is_a_load_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "tokenizer.model").write_bytes(content)
    with pytest.raises(ModelLoadError, match="SentencePiece model"):
        Tokenizer.from_folder(tmp_path)


def test_tokenizer_json_wins_and_hub_downloads_fetch_tokenizer_model(tmp_path: Path) -> None:
    train(tmp_path)
    assert Tokenizer.from_folder(tmp_path / "missing") is None
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    assert "tokenizer.model" in HUB_PATTERNS


def test_a_checkpoint_with_only_tokenizer_model_generates(tmp_path: Path) -> None:
    """The tiny llama checkpoint (vocabulary 256, BOS 1, EOS 2) with a tokenizer.model trained to fit."""
    from atlas_core import LLM, SamplingParams

    folder = tmp_path / "llama-sp"
    shutil.copytree(TINY / "llama", folder, ignore=shutil.ignore_patterns("reference.npz"))
    processor = train(folder, vocab_size=200, byte_fallback=False)
    llm = LLM(str(folder), backend="numpy")
    [output] = llm.generate(["Hello world"], SamplingParams(max_tokens=4, temperature=0))
    assert output.prompt_token_ids == [1, *processor.encode("Hello world")]
    assert len(output.outputs[0].token_ids) == 4
