"""State checkpoints of the recurrent ops (``causal_conv1d``, ``gated_delta_rule``, ``mamba2_scan``).

A recurrent op updates each sequence's state row in place over all of its tokens in the call. With
``checkpoints`` (a backend int32 array ``[T]``, one entry per token of the batch), the op also writes the
state *after* token ``t`` (the sequence's state through ``t``) into row ``checkpoints[t]`` of the same state
arrays; ``-1`` writes nothing. Speculative decoding's verify steps on hybrid models use it: the state after
each draft position is kept, and when later drafts are rejected the state after the last accepted one is
copied back into the sequence's slot, without recomputing any token. Checkpoint rows are distinct from each
other and from the batch's ``state_slots``, and a sequence with checkpoints has fewer than
`CHECKPOINTED_TOKENS` tokens in the call (a verify step's known token and drafts), so that a backend computes it
in the recurrent (token by token) form while the other sequences of the call may take a chunked one.
"""

from __future__ import annotations

import numpy as np

CHECKPOINTED_TOKENS = 64
"""A sequence with checkpoints has fewer tokens than this in a call (the chunked forms start at 64 tokens)."""


def checkpoint_segments(start: int, end: int, checkpoints: np.ndarray | None) -> list[tuple[int, int, int]]:
    """Rows ``start:end`` of one sequence as consecutive ``(first, stop, slot)`` segments, each ending after a
    checkpointed token (``slot``: its checkpoint row) or at ``end`` (``slot`` -1): a reference runs each segment
    in turn and, where ``slot >= 0``, stores the state it reached there."""
    if checkpoints is None:
        return [(start, end, -1)]
    segments, first = [], start
    for t in range(start, end):
        slot = int(checkpoints[t])
        if slot >= 0:
            segments.append((first, t + 1, slot))
            first = t + 1
    if first < end:
        segments.append((first, end, -1))
    return segments


def check_checkpoints(
    checkpoints: np.ndarray | None,
    tokens: int,
    state_slots: np.ndarray,
    num_slots: int,
    query_start_loc: np.ndarray | None = None,
) -> None:
    """`ValueError` unless ``checkpoints`` (when given) has one entry per token, every entry -1 or a row of the
    state that no sequence of the batch holds, no row twice, and (with ``query_start_loc``) no sequence with
    checkpoints has `CHECKPOINTED_TOKENS` tokens or more."""
    if checkpoints is None:
        return
    rows = np.asarray(checkpoints, dtype=np.int64)
    if rows.shape != (tokens,):
        raise ValueError(f"checkpoints has shape {rows.shape}, expected one entry per token ({tokens},)")
    if query_start_loc is not None:
        starts = np.asarray(query_start_loc, dtype=np.int64)
        for start, end in zip(starts[:-1], starts[1:], strict=True):
            if end - start >= CHECKPOINTED_TOKENS and (rows[start:end] >= 0).any():
                raise ValueError(
                    f"a sequence of {end - start} tokens has checkpoints; sequences with checkpoints have fewer "
                    f"than {CHECKPOINTED_TOKENS} tokens in a call"
                )
    taken = rows[rows >= 0]
    if (rows < -1).any() or (taken >= num_slots).any():
        raise ValueError(f"checkpoint rows {taken.tolist()} are outside the state's {num_slots} slots (-1: none)")
    if len(np.unique(taken)) != len(taken) or np.isin(taken, np.asarray(state_slots)).any():
        raise ValueError(
            f"checkpoint rows {taken.tolist()} repeat or are held by the batch's sequences "
            f"(state_slots={np.asarray(state_slots).tolist()})"
        )
