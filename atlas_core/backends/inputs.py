"""The input records of the backend ops (`atlas_core.backends.base`): where a flattened paged batch's queries and
keys live (`AttentionMetadata`), per-row sampling parameters (`SamplingTensors`) and logit penalties and biases
(`LogitAdjustments`); and the copies to the host that `Backend.download_async` starts (`Download`).
`atlas_core.backends.base` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class AttentionMetadata:
    """Where each sequence's queries and keys live in one flattened, paged batch.

    int32 arrays on the backend (the runner uploads them with ``from_numpy``).
      query_start_loc [B+1]: sequence b's query tokens are rows ``query_start_loc[b]:query_start_loc[b+1]``.
      seq_lens [B]: keys visible to sequence b after this step (cached + new tokens).
      block_tables [B, max_blocks]: KV block ids of each sequence, in order (-1 padding).
      slot_mapping [T]: flat KV slot (block * block_size + offset) each new token is written to.
    Query row i of sequence b sits at position ``seq_lens[b] - q_len_b + i`` and attends causally
    to keys ``0 ..= that position``.
      visible_end [T] or None: when set, query row t attends to keys ``0 .. visible_end[t] - 1`` instead
    (at least its own position + 1, never past its sequence's ``seq_lens``, non-decreasing along each
    sequence's rows): the tokens of an image that attends to itself bidirectionally (Gemma 3 / 4) see
    the whole image. A sliding window still counts back from the row's own position. None in decode.
    """

    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    visible_end: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters for `Backend.sample`, host NumPy arrays of length S.

    temperature float32 (0 = greedy), top_k int32 (0 = off), top_p float32 (1 = off),
    min_p float32 (0 = off), uniform float32 in [0, 1): the row's random draw, made by the
    host from the request's own generator so a seed gives the same tokens batched or alone.
    top_n_sigma float32 (0 = off): keep the tokens whose scaled logit is at least
    ``max - n * std`` of the row. Fields after ``uniform`` have defaults, so callers that predate
    them keep working; None (the default) means off for every row and is replaced by zeros on
    construction, so backends always see an array.
    """

    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    uniform: np.ndarray
    top_n_sigma: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.top_n_sigma is None:
            self.top_n_sigma = np.zeros(len(self.temperature), dtype=np.float32)


@dataclass
class LogitAdjustments:
    """Penalties and biases for `Backend.adjust_logits`, host NumPy arrays.

    Per row (length S): repetition_penalty float32 (1 = off), presence_penalty and
    frequency_penalty float32 (0 = off).
    Penalty entries (length E), one per distinct (row, token) that occurs in the row's prompt or
    generated output: penalty_rows int32, penalty_tokens int32, output_counts int32 (occurrences
    of the token in the output so far), in_prompt bool.
    Bias entries (length F): bias_rows int32, bias_tokens int32, bias_values float32 (finite or
    -inf, which bans the token); duplicate (row, token) entries add up.
    """

    repetition_penalty: np.ndarray
    presence_penalty: np.ndarray
    frequency_penalty: np.ndarray
    penalty_rows: np.ndarray
    penalty_tokens: np.ndarray
    output_counts: np.ndarray
    in_prompt: np.ndarray
    bias_rows: np.ndarray
    bias_tokens: np.ndarray
    bias_values: np.ndarray

    @classmethod
    def none(cls, num_rows: int) -> LogitAdjustments:
        """No penalty and no bias for any of ``num_rows`` rows (`adjust_logits` returns at once)."""
        ints, floats = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        return cls(
            repetition_penalty=np.ones(num_rows, dtype=np.float32),
            presence_penalty=np.zeros(num_rows, dtype=np.float32),
            frequency_penalty=np.zeros(num_rows, dtype=np.float32),
            penalty_rows=ints,
            penalty_tokens=ints,
            output_counts=ints,
            in_prompt=np.zeros(0, dtype=bool),
            bias_rows=ints,
            bias_tokens=ints,
            bias_values=floats,
        )

    @property
    def is_empty(self) -> bool:
        """True when there is neither a penalty entry nor a bias entry: the logits stay as they are."""
        return len(self.penalty_rows) == 0 and len(self.bias_rows) == 0


class Download(Protocol):
    """A copy to the host started by `Backend.download_async`."""

    def result(self) -> np.ndarray:
        """The copied array, once the copy is done (waits for it alone)."""
        ...


@dataclass
class ReadyDownload:
    """A `Download` whose array was copied when it was made (backends that compute as they are called)."""

    array: np.ndarray

    def result(self) -> np.ndarray:
        return self.array
