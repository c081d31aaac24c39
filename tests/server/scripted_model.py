"""A test-only model whose logits force a scripted answer, for exact end-to-end server tests.

`ScriptedModel` runs inside the real engine (scheduler, paged KV cache, sampler): it stores each
token id in its one-value-per-token KV cache and reads a sequence's whole context back through
the block table, as attention would. The answer starts after the last assistant header of the
ChatML template (``<|im_start|>assistant\\n``); the script is the one whose key occurs latest in
the prompt text. The next token is the script's next token (then EOS) while the answer so far
follows the script; anything else gets EOS. The chosen token's logit is 30, every other 0.
``delay_s`` slows every forward down, to keep requests running while a test acts on them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache, KVLayout, slots_for
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.model.load import LoadedModel
from atlas_core.model.resolve import ResolvedModel
from atlas_core.model.transformer import TransformerModel
from atlas_core.tokenizer import Tokenizer

ANSWER_HEADER = "<|im_start|>assistant\n"
FORCED_LOGIT = 30.0


class ScriptedModel(TransformerModel):
    """See the module docstring. ``scripts`` maps a key found in the prompt to the answer text."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        scripts: dict[str, str],
        *,
        delay_s: float = 0.0,
        max_position_embeddings: int = 4096,
    ) -> None:
        vocab = tokenizer.vocab_size
        super().__init__(
            backend,
            embed_tokens=backend.zeros((1, 1), np.float32),
            layers=[],
            final_norm=None,  # type: ignore[arg-type]
            lm_head=backend.zeros((1, 1), np.float32),
            kv_layouts=[KVLayout(1, 1, np.dtype(np.float32))],
            vocab_size=vocab,
            max_position_embeddings=max_position_embeddings,
        )
        self.tokenizer = tokenizer
        self.scripts = {key: tokenizer.encode(text, add_special_tokens=False) for key, text in scripts.items()}
        self.header = tokenizer.encode(ANSWER_HEADER, add_special_tokens=False)
        self.eos = tokenizer.eos_token_ids[0]
        self.delay_s = delay_s
        self._chosen: dict[tuple[int, ...], list[int] | None] = {}

    def forward(self, batch: ForwardBatch, kv: KVCache) -> Array:
        if self.delay_s:
            time.sleep(self.delay_s)
        to_numpy = self.backend.to_numpy
        ids = to_numpy(batch.input_ids).astype(np.float32)
        slots = to_numpy(batch.attention.slot_mapping)
        cache = kv.keys[0].reshape(-1)
        cache[slots[slots >= 0]] = ids[slots >= 0]
        starts = to_numpy(batch.attention.query_start_loc)
        lengths = to_numpy(batch.attention.seq_lens)
        tables = to_numpy(batch.attention.block_tables)
        hidden = np.zeros((batch.num_tokens, 1), np.float32)
        for b, length in enumerate(lengths.tolist()):
            blocks = [int(x) for x in tables[b] if x >= 0]
            context = cache[slots_for(blocks, kv.block_size, 0, length)].astype(np.int64).tolist()
            hidden[starts[b + 1] - 1, 0] = self.next_token(context)
        return self.backend.from_numpy(hidden)

    def compute_logits(self, hidden: Array) -> Array:
        targets = self.backend.to_numpy(hidden)[:, 0].astype(np.int64)
        logits = np.zeros((len(targets), self.vocab_size), np.float32)
        logits[np.arange(len(targets)), targets] = FORCED_LOGIT
        return self.backend.from_numpy(logits)

    def next_token(self, context: list[int]) -> int:
        start = _last_end_of(context, self.header)
        if start is None:
            return self.eos
        script = self._script_for(tuple(context[:start]))
        answer = context[start:]
        if script is None or answer != script[: len(answer)] or len(answer) >= len(script):
            return self.eos
        return script[len(answer)]

    def _script_for(self, prompt: tuple[int, ...]) -> list[int] | None:
        if prompt not in self._chosen:
            text = self.tokenizer.decode(list(prompt), skip_special_tokens=False)
            found = [(text.rfind(key), key) for key in self.scripts if key in text]
            self._chosen[prompt] = self.scripts[max(found)[1]] if found else None
        return self._chosen[prompt]


def _last_end_of(sequence: list[int], pattern: list[int]) -> int | None:
    """Index just after the last occurrence of ``pattern`` in ``sequence``."""
    for start in range(len(sequence) - len(pattern), -1, -1):
        if sequence[start : start + len(pattern)] == pattern:
            return start + len(pattern)
    return None


def scripted_engine(
    backend: Backend, tokenizer: Tokenizer, scripts: dict[str, str], *, max_seq_len: int = 1024, delay_s: float = 0.0
) -> LLMEngine:
    """An `LLMEngine` serving a `ScriptedModel` with ``tokenizer`` (which needs a ChatML template)."""
    model = ScriptedModel(backend, tokenizer, scripts, delay_s=delay_s)
    loaded = LoadedModel(
        name="scripted",
        resolved=ResolvedModel(Path("scripted"), "folder", "scripted"),
        config={},
        model=model,
        tokenizer=tokenizer,
        family_defaults={},
    )
    return LLMEngine(loaded, backend, EngineConfig(max_seq_len=max_seq_len, kv_cache_memory_gib=0.01))
