"""Results of generation, shaped like vLLM's so code can switch between them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability, its rank among all tokens (1 = most likely), and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]
"""token id -> `Logprob`: the chosen token plus the top alternatives at one position."""


@dataclass
class CompletionOutput:
    """One generated completion. ``finish_reason`` is ``"stop"``, ``"length"``, ``"abort"``,
    ``"error"``, or None while running; ``stop_reason`` is the stop string or token id that ended it, if any."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its completions. ``prompt_logprobs[0]`` is None (no context).
    ``num_cached_tokens`` prompt tokens were served from the prefix cache; ``error`` is set when
    the request failed (its completions then finish with reason ``"error"``; ``error_invalid``: through its
    own input, such as an output constraint the grammar cannot follow). ``embedding``: the
    pooled final hidden state ``[H]`` (float32) of a finished pooling request, else None.
    ``prompt_token_ids`` is the request's own list, the same object in each of its outputs (a long prompt
    is not copied at every step): read it, do not modify it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    error_invalid: bool = False
    embedding: np.ndarray | None = None


@dataclass
class EmbeddingOutput:
    """The embedding of one prompt (`LLM.embed`): float32 ``[dimensions]``."""

    prompt_token_ids: list[int]
    embedding: np.ndarray
