"""The tokenizer of a SentencePiece-only model folder: a ``tokenizer.model`` and no ``tokenizer.json``.

``tokenizer.model`` is a serialized SentencePiece ``ModelProto``, read with the ``sentencepiece``
package's own protobuf definition (``sentencepiece_model_pb2``, parsed by ``protobuf``). Its pieces,
scores and piece types are what llama.cpp copies into a GGUF file, with the same type codes, so a
BPE model is rebuilt by `build_tokenizer_from_gguf`'s SentencePiece path: ``▁`` for spaces, byte
fallback, control pieces as special tokens, user-defined pieces as added tokens, merges derived from
the scores. The result encodes as ``sentencepiece`` itself does for models that normalize nothing
(``identity`` rules, no whitespace folding), as the decoder LLMs that ship a ``tokenizer.model``
do (Llama 2, Mistral, Gemma), with two differences shared with GGUF files: text that begins with a
space gets one ``▁`` prefix where ``sentencepiece`` writes two, and a control piece's string in the
text (``</s>``) is that token, as in transformers, where ``sentencepiece`` spells it out.

Refused with a `ModelLoadError` naming the file: a file that is not a SentencePiece model, a
model type other than BPE (unigram models: T5, ALBERT ...), and a model whose normalizer rewrites
text (NFKC rules, folded whitespace), which this rebuild would not reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atlas_core.errors import ModelLoadError
from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf
from atlas_core.tokenizer.tokenizer import Tokenizer
from atlas_core.weights.gguf import GGUFTokenizerSpec

_BPE = 2
"""``TrainerSpec.model_type`` of BPE models (1 is unigram, 3 word, 4 char)."""


def read_model_proto(path: Path) -> Any:
    """The parsed ``ModelProto`` of the SentencePiece model file at ``path``; `ModelLoadError` naming
    the file when it cannot be read or is not a SentencePiece model."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated at import
    try:
        proto.ParseFromString(path.read_bytes())
    except (OSError, DecodeError) as e:
        raise ModelLoadError(f"{path}: not a readable SentencePiece model: {e}") from e
    if not proto.pieces:
        raise ModelLoadError(f"{path}: not a SentencePiece model (it holds no pieces)")
    return proto


def tokenizer_from_sentencepiece(path: Path) -> Tokenizer:
    """The `Tokenizer` of the SentencePiece model file at ``path`` (see the module docstring): BOS,
    EOS, unknown and padding ids from the model's trainer settings, BOS added to encoded text, no
    chat template (`Tokenizer.from_folder` applies ``tokenizer_config.json`` on top)."""
    proto = read_model_proto(path)
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    if trainer.model_type != _BPE:
        kind = {1: "unigram", 3: "word", 4: "char"}.get(trainer.model_type, str(trainer.model_type))
        raise ModelLoadError(
            f"{path}: SentencePiece {kind} models are not supported (only BPE); "
            "add the model's tokenizer.json (transformers can convert it) to load it"
        )
    if normalizer.precompiled_charsmap or normalizer.remove_extra_whitespaces or not normalizer.escape_whitespaces:
        raise ModelLoadError(
            f"{path}: the SentencePiece normalizer {normalizer.name!r} rewrites text (character rules or "
            "folded whitespace), which is not supported; add the model's tokenizer.json to load it"
        )

    def special_id(value: int) -> int | None:
        return value if 0 <= value < len(proto.pieces) else None

    spec = GGUFTokenizerSpec(
        source=str(path),
        model="llama",
        pre=None,
        tokens=[piece.piece for piece in proto.pieces],
        token_types=[int(piece.type) for piece in proto.pieces],
        scores=[float(piece.score) for piece in proto.pieces],
        merges=None,
        bos_token_id=special_id(trainer.bos_id),
        eos_token_id=special_id(trainer.eos_id),
        eot_token_id=None,
        eom_token_id=None,
        unknown_token_id=special_id(trainer.unk_id),
        padding_token_id=special_id(trainer.pad_id),
        add_bos_token=True,
        add_space_prefix=normalizer.add_dummy_prefix,
        chat_template=None,
    )
    return build_tokenizer_from_gguf(spec)


__all__ = ["read_model_proto", "tokenizer_from_sentencepiece"]
