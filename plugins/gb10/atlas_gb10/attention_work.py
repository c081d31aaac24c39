"""The work lists of attention launches: query tiles of each sequence, their items (tile and context split), the
fixed plans captured decode graphs replay, and what one eager forward's launches share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StaticAttentionPlan:
    """A fixed work list for graph capture: every sequence of the bucket is ``query_tokens`` tokens (one
    decode token, or a verify step's token and its drafts), cut into ``splits`` splits of the context
    (rows whose context is shorter get empty splits); 0: direct mode."""

    work: Any
    """Device int32 ``[num_seqs * splits, 4]``: (sequence, 0, split, 0)."""
    splits: int
    derived: dict[str, Any] = field(default_factory=dict)
    """Plans other kernels derive from this one (MLA's, whose splits are longer; the query tiles of
    several tokens per sequence), made during the eager warm-up before capture and kept as long as the
    graph that holds this plan."""
    query_tokens: int = 1

    @property
    def num_seqs(self) -> int:
        return int(self.work.shape[0]) // max(self.splits, 1)


@dataclass
class LaunchPlan:
    """The work of one attention launch: its device work list (`work_items`), item count, splits and tile rows."""

    work: Any
    items: int
    splits: int  # 0: direct mode
    tile_rows: int


@dataclass
class ForwardInputs:
    """What every attention launch of one eager forward shares, keyed by that forward's device arrays of query starts
    and lengths (also shared by launches given a copy of the metadata with other fields, as Gemma 4's causal
    full-attention layers are): those arrays on the host, read once, and the work list of each launch shape, built
    once for all the layers of that shape."""

    query_start_loc: Any
    seq_lens: Any
    host_starts: np.ndarray
    host_lengths: np.ndarray
    plans: dict[tuple[int, ...], LaunchPlan] = field(default_factory=dict)


def query_tiles(q_lens: np.ndarray, tokens_per_tile: int) -> tuple[np.ndarray, np.ndarray]:
    """(sequence, first query token) of every tile of ``tokens_per_tile`` query tokens."""
    seqs = np.repeat(np.arange(len(q_lens)), -(-q_lens // tokens_per_tile))
    first = np.concatenate([np.arange(0, n, tokens_per_tile) for n in q_lens]) if len(q_lens) else np.zeros(0, np.int64)
    return seqs, first


def longest_first(
    seqs: np.ndarray, first: np.ndarray, q_lens: np.ndarray, lengths: np.ndarray, tokens_per_tile: int
) -> tuple[np.ndarray, np.ndarray]:
    """The tiles of `query_tiles` in descending order of the keys their last token sees (ties in their order), so
    that the blocks that run longest start first and the short ones fill the last wave."""
    last = np.minimum(first + tokens_per_tile, q_lens[seqs]) - 1
    order = np.argsort(-(lengths[seqs] - q_lens[seqs] + last), kind="stable")
    return seqs[order], first[order]


def work_items(seqs: np.ndarray, first: np.ndarray, splits: int) -> np.ndarray:
    """Work items (sequence, first query token, split, 0): each tile cut into ``splits`` splits of its
    context, or (direct mode, ``splits`` 0) one item per tile with split -1."""
    if not splits:
        work = np.zeros((len(seqs), 4), dtype=np.int32)
        work[:, 0], work[:, 1], work[:, 2] = seqs, first, -1
        return work
    work = np.zeros((len(seqs) * splits, 4), dtype=np.int32)
    work[:, 0] = np.repeat(seqs, splits)
    work[:, 1] = np.repeat(first, splits)
    work[:, 2] = np.tile(np.arange(splits), len(seqs))
    return work
