"""Small tokenizers built in memory for the tests (no network, no torch): a byte-level BPE and a Llama-style
SentencePiece BPE, a `Tokenizer` around either, and a model folder holding one."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from atlas_core.tokenizer import Tokenizer

SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<pad>"]
CORPUS = [
    "Hello world, this is a test of the tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Atlas runs language models with NumPy.",
]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_level_backend() -> Backend:
    """A GPT-2 style byte-level BPE trained on ASCII text, so emoji and CJK split into byte tokens."""
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    return backend


def sentencepiece_backend() -> Backend:
    """A Llama-style SentencePiece BPE: ``▁`` word marker, byte fallback, leading-space strip,
    and a post-processor that adds ``<s>``."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁h", "▁he", "ll", "▁hell", "▁hello"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("▁h", "e"), ("l", "l"), ("▁he", "ll"), ("▁hell", "o")]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return backend


def make(backend: Backend, **kwargs) -> Tokenizer:
    settings = dict(bos_token_id=backend.token_to_id("<s>"), eos_token_ids=[backend.token_to_id("</s>")])
    settings.setdefault("chat_template", None)
    settings.update(kwargs)
    return Tokenizer(backend, **settings)


def write_folder(folder: Path, backend: Backend, **files: object) -> Path:
    """A model folder with tokenizer.json plus each keyword as a file (dots as ``__``)."""
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (folder / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return folder
