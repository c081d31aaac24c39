"""Building `PositionLogprobs` (chosen token + top-k alternatives with ranks) from log-softmax rows."""

from __future__ import annotations

import numpy as np

from atlas_core.engine.outputs import Logprob, PositionLogprobs
from atlas_core.tokenizer import Tokenizer


def position_logprobs(row: np.ndarray, chosen: int, top: int, tokenizer: Tokenizer | None) -> PositionLogprobs:
    """The chosen token's entry first, then the ``top`` most likely tokens (rank 1 = argmax)."""

    def entry(token: int, rank: int) -> Logprob:
        text = tokenizer.token_to_str(token) if tokenizer is not None else None
        return Logprob(float(row[token]), rank, text)

    result = {chosen: entry(chosen, 1 + int(np.count_nonzero(row > row[chosen])))}
    if top > 0:
        best = np.argpartition(-row, top - 1)[:top]
        best = best[np.lexsort((best, -row[best]))]
        for rank, token in enumerate(best.tolist(), start=1):
            result.setdefault(token, entry(token, rank))
    return result
