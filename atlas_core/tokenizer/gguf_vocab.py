"""Rebuilding a model's tokenizer from a GGUF file's ``tokenizer.*`` metadata.

A GGUF carries no ``tokenizer.json``: llama.cpp stores the vocabulary, merges, token types and
special ids as metadata. `build_tokenizer_from_gguf` turns them back into a `tokenizers`
backend wrapped in Atlas's `Tokenizer`:

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE. ``tokenizer.ggml.pre`` picks the split
  rule llama.cpp applies before BPE (`_PRE_TOKENIZERS`); an unknown one falls back to GPT-2's
  regex with a warning.
* ``"llama"``: SentencePiece-style BPE with byte fallback and a ``▁`` prefix (merges from the
  file, or derived from the token scores when it has none).

Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
tokens, so ``<|im_start|>`` or ``<think>`` always encode as one id. End-of-generation ids are
``eos``, ``eot`` and ``eom`` plus the control tokens llama.cpp treats as end markers by name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from atlas_core.errors import ModelLoadError
from atlas_core.tokenizer.tokenizer import Tokenizer
from atlas_core.weights.gguf import GGUFSource, GGUFTokenizerSpec, read_tokenizer_spec
from atlas_core.weights.gguf_index import open_gguf, parse_gguf_header

logger = logging.getLogger(__name__)

_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
_END_MARKERS = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<|end_of_text|>", "<EOT>"}
)
"""Control tokens llama.cpp stops generation on by name, whatever the file's eos id says."""

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    """GPT-2's regex, built into `ByteLevel`."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    """Every digit on its own (llama.cpp's ``\\p{N}`` pass), then GPT-2's regex."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2,
    "gpt2": _gpt2,
    "gpt-2": _gpt2,
    "mpt": _gpt2,
    "olmo": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "command-r": _digits_then_gpt2,
    "codeshell": _digits_then_gpt2,
    "exaone": _digits_then_gpt2,
    "llama3": _split(_LLAMA3_SPLIT),
    "llama-v3": _split(_LLAMA3_SPLIT),
    "llama-bpe": _split(_LLAMA3_SPLIT),
    "falcon3": _split(_LLAMA3_SPLIT),
    "pixtral": _split(_LLAMA3_SPLIT),
    "qwen2": _split(_QWEN2_SPLIT),
    "deepseek-r1-qwen": _split(_QWEN2_SPLIT),
}
"""``tokenizer.ggml.pre`` -> the pre-tokenizer reproducing llama.cpp's split for that type."""

_IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})
"""Pre types whose words found whole in the vocabulary skip BPE (llama.cpp's ``ignore_merges``)."""


def build_tokenizer_from_gguf(
    reader_or_source: GGUFSource | GGUFReader | GGUFTokenizerSpec | str | os.PathLike[str],
) -> Tokenizer:
    """The `Tokenizer` a GGUF file describes (given as a source, a reader, a spec or a path).

    Raises `ModelLoadError` naming the file when it has no tokenizer or an unsupported
    ``tokenizer.ggml.model``.
    """
    spec = _spec(reader_or_source)
    if spec.model == "gpt2":
        backend = _byte_level_bpe(spec)
    elif spec.model == "llama":
        backend = _sentencepiece_bpe(spec)
    else:
        raise ModelLoadError(
            f"{spec.source or 'GGUF file'}: tokenizer model {spec.model!r} is not supported; "
            "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE)"
        )
    _add_special_tokens(backend, spec)

    def token(token_id: int | None) -> str | None:
        return spec.tokens[token_id] if token_id is not None and 0 <= token_id < len(spec.tokens) else None

    special = {
        key: text
        for key, token_id in (
            ("bos_token", spec.bos_token_id),
            ("eos_token", spec.eos_token_id),
            ("unk_token", spec.unknown_token_id),
            ("pad_token", spec.padding_token_id),
        )
        if (text := token(token_id)) is not None
    }
    add_bos = spec.add_bos_token if spec.add_bos_token is not None else spec.model == "llama"
    return Tokenizer(
        backend,
        bos_token_id=spec.bos_token_id,
        eos_token_ids=_end_ids(spec),
        chat_template=spec.chat_template,
        add_bos_token=add_bos,
        special_token_strings=special,
        source=spec.source,
    )


def _spec(given: GGUFSource | GGUFReader | GGUFTokenizerSpec | str | os.PathLike[str]) -> GGUFTokenizerSpec:
    if isinstance(given, GGUFTokenizerSpec):
        return given
    if isinstance(given, GGUFSource):
        return given.tokenizer_spec()
    if isinstance(given, GGUFReader):
        return read_tokenizer_spec(parse_gguf_header(given.data).fields)
    return read_tokenizer_spec(open_gguf(given).header.fields, str(given))


def _byte_level_bpe(spec: GGUFTokenizerSpec) -> Backend:
    """GPT-2-style byte-level BPE with the split rule ``tokenizer.ggml.pre`` names."""
    pre = spec.pre or "default"
    build_pre = _PRE_TOKENIZERS.get(pre)
    if build_pre is None:
        logger.warning(
            "%s: unknown GGUF pre-tokenizer %r; splitting text with GPT-2's regex, which may tokenize "
            "differently from llama.cpp",
            spec.source or "GGUF file",
            pre,
        )
        build_pre = _gpt2
    merges = _merge_pairs(spec, spec.merges or [])
    backend = Backend(
        models.BPE(vocab=_vocab(spec), merges=merges, ignore_merges=pre in _IGNORE_MERGES, fuse_unk=False)
    )
    if pre in ("qwen2", "deepseek-r1-qwen"):
        backend.normalizer = normalizers.NFC()  # as in Qwen2's own tokenizer.json
    backend.pre_tokenizer = build_pre()
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(spec: GGUFTokenizerSpec) -> Backend:
    """SentencePiece BPE (Llama 2, Mistral...): ``▁`` for spaces, ``<0xXX>`` byte fallback."""
    vocab = _vocab(spec)
    if spec.merges:
        merges = _merge_pairs(spec, spec.merges)
    elif spec.scores:
        merges = _merges_from_scores(spec.tokens, spec.scores, vocab)
    else:
        raise ModelLoadError(f"{spec.source or 'GGUF file'}: SentencePiece vocabulary has neither merges nor scores")
    unk = spec.tokens[spec.unknown_token_id] if spec.unknown_token_id is not None else None
    backend = Backend(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = spec.add_space_prefix if spec.add_space_prefix is not None else True
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _vocab(spec: GGUFTokenizerSpec) -> dict[str, int]:
    """Token -> id; a token listed twice maps to its last id, as in llama.cpp."""
    return {token: index for index, token in enumerate(spec.tokens)}


def _merge_pairs(spec: GGUFTokenizerSpec, merges: list[str]) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` lines (``"left right"``) as ``(left, right)`` pairs, split at the first
    space; `ModelLoadError` for a line without one."""
    pairs = []
    for merge in merges:
        left, space, right = merge.partition(" ")
        if not space:
            where = spec.source or "GGUF file"
            raise ModelLoadError(f"{where}: merge {merge!r} is not two tokens separated by a space")
        pairs.append((left, right))
    return pairs


def _merges_from_scores(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a scored vocabulary: every split of a token into two known tokens,
    best-scoring token first (transformers' ``generate_merges``)."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, score in zip(tokens, scores, strict=True):
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        pairs.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked.extend((score, len(left), len(right), left, right) for left, right in pairs)
    ranked.sort(key=lambda merge: merge[:3], reverse=True)
    return [(left, right) for *_, left, right in ranked]


def _token_types(spec: GGUFTokenizerSpec) -> list[int]:
    """One llama.cpp token type per token: the file's, or all normal when it lists none."""
    return spec.token_types or [_NORMAL] * len(spec.tokens)


def _add_special_tokens(backend: Backend, spec: GGUFTokenizerSpec) -> None:
    """Control tokens as special added tokens, user-defined ones as plain added tokens."""
    typed = list(zip(spec.tokens, _token_types(spec), strict=True))
    control = [AddedToken(t, special=True, normalized=False) for t, k in typed if k == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in typed if k == _USER_DEFINED]
    backend.add_special_tokens(control)
    backend.add_tokens(user)


def _end_ids(spec: GGUFTokenizerSpec) -> list[int]:
    """eos, eot and eom ids, then control tokens llama.cpp ends generation on by name."""
    ids = [i for i in (spec.eos_token_id, spec.eot_token_id, spec.eom_token_id) if i is not None]
    typed = zip(spec.tokens, _token_types(spec), strict=True)
    ids += [i for i, (t, k) in enumerate(typed) if k == _CONTROL and t in _END_MARKERS]
    return list(dict.fromkeys(ids))
