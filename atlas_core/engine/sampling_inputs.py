"""Per-row sampling inputs for the backend, built from the sequences being sampled."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as Seq

import numpy as np

from atlas_core.backends.base import LogitAdjustments, SamplingTensors
from atlas_core.engine.sequence import Sequence


def sampling_tensors(seqs: Seq[Sequence], offsets: Seq[int] | None = None) -> SamplingTensors:
    """Filters and one uniform draw per row: row ``i`` samples output token number
    ``len(seqs[i].output_ids) + offsets[i]`` of its sequence (offsets: all 0 when None; speculative
    verification samples several positions of one sequence)."""
    params = [seq.params for seq in seqs]
    return SamplingTensors(
        temperature=np.asarray([p.temperature for p in params], dtype=np.float32),
        top_k=np.asarray([p.top_k for p in params], dtype=np.int32),
        top_p=np.asarray([p.top_p for p in params], dtype=np.float32),
        min_p=np.asarray([p.min_p for p in params], dtype=np.float32),
        uniform=np.asarray(
            [seq.uniform(offset) for seq, offset in zip(seqs, offsets or [0] * len(seqs), strict=True)],
            dtype=np.float32,
        ),
        top_n_sigma=np.asarray([p.top_n_sigma for p in params], dtype=np.float32),
    )


def logit_adjustments(
    seqs: Seq[Sequence], bans: tuple[np.ndarray, np.ndarray] | None = None, drafted: Seq[Seq[int]] | None = None
) -> LogitAdjustments | None:
    """Penalties, logit bias, min_tokens bans and ``bans`` (rows, tokens: grammar masks) for the
    rows; None when no row needs any. ``drafted[i]``: the draft tokens before row ``i``'s position in a
    verify step, counted as output by the penalties (the row samples as if they were accepted)."""
    penalised = [row for row, seq in enumerate(seqs) if seq.params.penalised]
    biased = [row for row, seq in enumerate(seqs) if seq.params.logit_bias or seq.min_tokens_pending]
    if not penalised and not biased and bans is None:
        return None
    rows, tokens, counts, in_prompt = [], [], [], []
    for row in penalised:
        seq = seqs[row]
        prompt_tokens = set(seq.token_ids[: seq.num_prompt_tokens])
        output_counts = seq.output_counts
        if drafted is not None and drafted[row]:
            output_counts = output_counts + Counter(drafted[row])
        for token in prompt_tokens | output_counts.keys():
            rows.append(row)
            tokens.append(token)
            counts.append(output_counts.get(token, 0))
            in_prompt.append(token in prompt_tokens)
    bias_rows: list[int] = []
    bias_tokens: list[int] = []
    bias_values: list[float] = []
    for row in biased:
        seq = seqs[row]
        entries = dict(seq.params.logit_bias)
        if seq.min_tokens_pending:
            entries.update(dict.fromkeys(seq.stop_token_ids, -np.inf))
        bias_rows.extend([row] * len(entries))
        bias_tokens.extend(entries)
        bias_values.extend(entries.values())
    no_bans = np.zeros(0, dtype=np.int32)
    ban_rows, ban_tokens = (
        (bans[0].astype(np.int32), bans[1].astype(np.int32)) if bans is not None else (no_bans, no_bans)
    )
    params = [seq.params for seq in seqs]
    return LogitAdjustments(
        repetition_penalty=np.asarray([p.repetition_penalty for p in params], dtype=np.float32),
        presence_penalty=np.asarray([p.presence_penalty for p in params], dtype=np.float32),
        frequency_penalty=np.asarray([p.frequency_penalty for p in params], dtype=np.float32),
        penalty_rows=np.asarray(rows, dtype=np.int32),
        penalty_tokens=np.asarray(tokens, dtype=np.int32),
        output_counts=np.asarray(counts, dtype=np.int32),
        in_prompt=np.asarray(in_prompt, dtype=bool),
        bias_rows=np.concatenate([np.asarray(bias_rows, dtype=np.int32), ban_rows]),
        bias_tokens=np.concatenate([np.asarray(bias_tokens, dtype=np.int32), ban_tokens]),
        bias_values=np.concatenate(
            [np.asarray(bias_values, dtype=np.float32), np.full(len(ban_rows), -np.inf, np.float32)]
        ),
    )
