"""A byte-level `Tokenizer` (one token per byte, plus a few special tokens) for grammar tests
that need no model."""

from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from atlas_core.tokenizer import Tokenizer

SPECIAL = ["<eos>", "[TOOL_CALLS]", "[THINK]", "[/THINK]"]


def byte_tokenizer(special: list[str] = SPECIAL) -> Tokenizer:
    """One token per byte, plus ``special`` as special tokens (the first one is EOS)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(special)
    return Tokenizer(backend, bos_token_id=None, eos_token_ids=[backend.token_to_id(special[0])], chat_template=None)
