"""Tokenization: `Tokenizer` (encode, decode, chat templates) loaded from a Hugging Face model
folder, `ChatTemplate` (sandboxed Jinja rendering) and `IncrementalDetokenizer` (streaming text)."""

from atlas_core.tokenizer.chat_template import ChatTemplate
from atlas_core.tokenizer.detokenizer import IncrementalDetokenizer
from atlas_core.tokenizer.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "Tokenizer"]
