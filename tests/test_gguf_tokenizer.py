"""The GGUF tokenizer rebuild (`atlas_core.tokenizer.gguf_vocab`): tokenizers trained in-test with
`tokenizers`, written to small GGUF files with `gguf.GGUFWriter` the way llama.cpp's converter does,
and rebuilt from that metadata. No torch, no network."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from atlas_core.tokenizer import Tokenizer
from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf

CORPUS = [
    "Hello world, this is a test of the tokenizer.",
    "The quick brown fox jumps over the lazy dog 12345 times.",
    "Atlas runs language models with NumPy.",
] * 3
SAMPLES = ["Hello world", "hello   world 2024", " leading space", "unknown Ωmega 😀", "<s>Hi</s> there", "a\nb", ""]


def _write_tokenizer_gguf(path: Path, reference: Backend, *, model: str, pre: str | None, merges: bool) -> None:
    vocab = reference.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    specials = {"<s>", "</s>", "<|im_start|>", "<|im_end|>"}
    types = [3 if t in specials else 2 if t == "<unk>" else 6 if t.startswith("<0x") else 1 for t in tokens]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    if merges:
        writer.add_token_merges([" ".join(m) for m in _merges(reference)])
    writer.add_bos_token_id(vocab["<s>"])
    writer.add_eos_token_id(vocab["</s>"])
    writer.add_chat_template("{% for m in messages %}<s>{{ m['content'] }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _merges(tokenizer: Backend) -> list[tuple[str, str]]:
    return [
        tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
        for m in json.loads(tokenizer.to_str())["model"]["merges"]
    ]


def _train(model: str) -> Backend:
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    if model == "llama":
        tokenizer = Backend(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        specials += [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials, show_progress=False)
    else:
        tokenizer = Backend(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


@pytest.mark.parametrize(
    ("model", "pre", "merges"), [("gpt2", "smollm", True), ("llama", None, True), ("llama", None, False)]
)
def test_tokenizer_rebuilt_from_metadata_matches_the_original(
    tmp_path: Path, model: str, pre: str | None, merges: bool
) -> None:
    reference = _train(model)
    _write_tokenizer_gguf(tmp_path / "t.gguf", reference, model=model, pre=pre, merges=merges)
    tokenizer = build_tokenizer_from_gguf(tmp_path / "t.gguf")
    assert isinstance(tokenizer, Tokenizer)
    for text in SAMPLES + ["<|im_start|>user\nHi<|im_end|>"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False).ids, text
        assert tokenizer.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    start = reference.token_to_id("<|im_start|>")
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [start]
    assert tokenizer.bos_token_id == reference.token_to_id("<s>")
    assert tokenizer.eos_token_ids[0] == reference.token_to_id("</s>")
    assert reference.token_to_id("<|im_end|>") in tokenizer.eos_token_ids  # llama.cpp's end-of-turn names
    assert tokenizer.add_bos_token is (model == "llama")  # llama.cpp's defaults when the file is silent
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=False) == "<s>x"


def test_unknown_pre_tokenizer_falls_back_to_gpt2_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_tokenizer_gguf(tmp_path / "t.gguf", _train("gpt2"), model="gpt2", pre="brand-new", merges=True)
    tokenizer = build_tokenizer_from_gguf(tmp_path / "t.gguf")
    assert "brand-new" in caplog.text
    assert tokenizer.decode(tokenizer.encode("Hello world", add_special_tokens=False)) == "Hello world"
