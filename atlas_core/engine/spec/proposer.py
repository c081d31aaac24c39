"""`Proposer`: what drafts speculative tokens; `NgramProposer`: prompt lookup.

A proposer returns *deterministic* drafts (a function of the sequence's tokens). Verification samples
the target's own token at every draft position and keeps drafts while they equal it
(`atlas_core.engine.spec.verify`), which leaves the distribution of the output exactly the target's.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import NamedTuple, Protocol

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.engine.sequence import Sequence


class Proposer(Protocol):
    """Drafts tokens for decoding sequences. Called from the engine thread only."""

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        """For each sequence, at most ``max_tokens[i]`` draft tokens continuing ``seqs[i].token_ids``
        (an empty list: no guess)."""
        ...

    def release(self, seq: Sequence) -> None:
        """Forget what is kept for ``seq`` (it finished, was aborted or preempted)."""
        ...


class HiddenSpan(NamedTuple):
    """Rows ``row .. row + length - 1`` of a target forward's final hidden states are ``seq``'s positions
    ``position .. position + length - 1``, all of them confirmed (rejected draft rows are left out)."""

    seq: Sequence
    row: int
    position: int
    length: int


class HiddenObserver(Protocol):
    """A proposer that reads the target's final hidden states (MTP heads). The runner calls `observe`
    after sampling, once the step's confirmed tokens are appended (a captured decode step shows its
    hidden states when the backend's graphs keep them, `DecodeGraphs.last_hidden`)."""

    def observe(self, hidden: Array, spans: Seq[HiddenSpan]) -> None:
        """The step's final hidden states ``[T, H]`` and which of their rows are whose positions."""
        ...


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last ``n`` tokens (``n`` from
    ``max_n`` down to ``min_n``, longest match first) and propose the tokens that followed it.

    Costs one vectorised scan of the sequence's tokens per call; keeps no state.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        return [self.lookup(seq.token_ids, k) for seq, k in zip(seqs, max_tokens, strict=True)]

    def lookup(self, token_ids: Seq[int], k: int) -> list[int]:
        """The ``k`` (or fewer, at the end of the tokens) tokens after the latest earlier match of the
        longest suffix of ``token_ids`` that occurs before; [] when none of ``min_n..max_n`` matches."""
        if k < 1 or len(token_ids) <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        size = len(tokens)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            suffix = tokens[size - n :]
            # windows starting at 0..size-n-1: every occurrence that ends before the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(tokens[: size - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return tokens[start : start + k].tolist()
        return []

    def release(self, seq: Sequence) -> None:
        return None
