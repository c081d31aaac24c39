"""Pooling a prompt's final hidden states into one vector (embedding requests).

A request whose `SamplingParams.pooling` is set runs its prompt through the normal schedule
(prefill chunks batched with other requests' work) but samples nothing: the runner hands each
chunk's final hidden states (after the final norm) to the request's `Pooler`, and when the prompt
is complete the sequence finishes with reason ``stop`` and `RequestOutput.embedding` holds the
pooled vector. Normalisation and truncation are the caller's (`atlas_core.engine.llm.LLM.embed`,
the ``/v1/embeddings`` route).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

PoolingType = Literal["last", "mean"]
"""``last``: the last prompt token's hidden state; ``mean``: the mean over every prompt position."""


class Pooler:
    """Accumulates one prompt's final hidden states, position by position.

    Chunks may repeat positions (a preempted sequence is recomputed from the start): `add` skips
    positions already seen, so each prompt position counts once. ``mean`` needs every position to be
    computed, so such requests never reuse cached prefix KV (`needs_every_position`)."""

    def __init__(self, kind: PoolingType, num_prompt_tokens: int) -> None:
        self.kind = kind
        self.num_prompt_tokens = num_prompt_tokens
        self.seen = 0
        self._sum: np.ndarray | None = None
        self._last: np.ndarray | None = None

    @property
    def needs_every_position(self) -> bool:
        """True when every prompt position's hidden state is needed (no prefix-cache reuse)."""
        return self.kind == "mean"

    def rows_wanted(self, start: int, end: int) -> tuple[int, int]:
        """Of a chunk computing prompt positions ``[start, end)``, the positions ``[first, stop)`` whose
        hidden states `add` needs (``first == stop``: none)."""
        if self.kind == "last":
            last = self.num_prompt_tokens - 1
            return (last, last + 1) if start <= last < end else (end, end)
        return max(start, self.seen), max(end, self.seen)

    def add(self, first: int, hidden: np.ndarray) -> None:
        """The final hidden states ``[count, H]`` of prompt positions ``first`` .. ``first + count - 1``."""
        rows = np.asarray(hidden, dtype=np.float32)
        if self.kind == "last":
            if first + len(rows) == self.num_prompt_tokens and len(rows):
                self._last = rows[-1].copy()
        else:
            rows = rows[max(0, self.seen - first) :]
            if len(rows):
                total = rows.astype(np.float64).sum(axis=0)
                self._sum = total if self._sum is None else self._sum + total
                self.seen = max(self.seen, first) + len(rows)
        self.seen = max(self.seen, first + len(hidden))

    @property
    def done(self) -> bool:
        return self.seen >= self.num_prompt_tokens

    def result(self) -> np.ndarray | None:
        """The pooled float32 vector ``[H]`` once every needed position was added, else None."""
        if not self.done:
            return None
        if self.kind == "last":
            return self._last
        assert self._sum is not None  # every position was added
        return (self._sum / self.num_prompt_tokens).astype(np.float32)
