"""Backend conformance: ``adjust_logits`` (repetition / presence / frequency penalties and sparse
logit biases, in place) against a float64 oracle, and banned tokens through ``sample``.

Fixtures, tolerances, the seed handling (``ATLAS_CONFORMANCE_SEED``) and the oracles shared with
other modules are in ``atlas_core.testing`` (``conformance``, ``oracles``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from atlas_core.backends.base import LogitAdjustments, SamplingTensors
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.oracles import oracle_argmax


# ---- building adjustments ------------------------------------------------------------------------
@dataclass
class Entries:
    """Adjustments as plain Python lists, turned into a `LogitAdjustments` by `build`."""

    repetition: list[float]
    presence: list[float]
    frequency: list[float]
    penalties: list[tuple[int, int, int, bool]] = field(default_factory=list)  # (row, token, count, in_prompt)
    biases: list[tuple[int, int, float]] = field(default_factory=list)  # (row, token, value)

    def build(self) -> LogitAdjustments:
        def column(items: list[tuple], i: int, dtype: type) -> np.ndarray:
            return np.asarray([item[i] for item in items], dtype=dtype).reshape(-1)

        return LogitAdjustments(
            repetition_penalty=np.asarray(self.repetition, dtype=np.float32),
            presence_penalty=np.asarray(self.presence, dtype=np.float32),
            frequency_penalty=np.asarray(self.frequency, dtype=np.float32),
            penalty_rows=column(self.penalties, 0, np.int32),
            penalty_tokens=column(self.penalties, 1, np.int32),
            output_counts=column(self.penalties, 2, np.int32),
            in_prompt=column(self.penalties, 3, bool),
            bias_rows=column(self.biases, 0, np.int32),
            bias_tokens=column(self.biases, 1, np.int32),
            bias_values=column(self.biases, 2, np.float32),
        )


# ---- float64 oracle ------------------------------------------------------------------------------
def oracle_adjust(logits: np.ndarray, adj: LogitAdjustments) -> np.ndarray:
    """Penalties entry by entry (repetition first, then frequency and presence), then the biases."""
    out = np.array(logits, dtype=np.float64)
    for e in range(len(adj.penalty_rows)):
        r, t, count = int(adj.penalty_rows[e]), int(adj.penalty_tokens[e]), int(adj.output_counts[e])
        value, penalty = out[r, t], float(adj.repetition_penalty[r])
        if bool(adj.in_prompt[e]) or count > 0:
            value = value / penalty if value > 0 else value * penalty
        value -= float(adj.frequency_penalty[r]) * count
        if count > 0:
            value -= float(adj.presence_penalty[r])
        out[r, t] = value
    for f in range(len(adj.bias_rows)):
        out[int(adj.bias_rows[f]), int(adj.bias_tokens[f])] += float(adj.bias_values[f])
    return out


def touched(adj: LogitAdjustments, shape: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    mask[adj.penalty_rows, adj.penalty_tokens] = True
    mask[adj.bias_rows, adj.bias_tokens] = True
    return mask


def random_entries(case: Case, rows: int, vocab: int) -> Entries:
    """Random per-row penalties; per row distinct penalised tokens in the prompt only, the output only
    or both; biases with duplicates, -inf bans and tokens that are also penalised; entries shuffled."""

    def pick(options: list[float], n: int) -> list[float]:
        return [options[int(i)] for i in case.rng.integers(len(options), size=n)]

    entries = Entries(
        repetition=pick([1.0, 0.8, 1.3, 2.0], rows),
        presence=pick([0.0, 0.5, -0.4, 1.5], rows),
        frequency=pick([0.0, 0.25, -0.1, 1.1], rows),
    )
    for r in range(rows):
        tokens = case.rng.choice(vocab, size=min(vocab, int(case.rng.integers(3, 12))), replace=False)
        for i, t in enumerate(tokens):
            kind = i % 3 if i < 3 else int(case.rng.integers(3))  # every kind in every row
            count = 0 if kind == 0 else int(case.rng.integers(1, 6))
            entries.penalties.append((r, int(t), count, kind != 1))
        for _ in range(int(case.rng.integers(0, 5))):
            entries.biases.append((r, int(case.rng.integers(vocab)), float(case.rng.normal())))
        entries.biases.append((r, int(tokens[0]), float(case.rng.normal())))  # on a penalised token
    for b in case.rng.choice(len(entries.biases), size=max(1, len(entries.biases) // 3), replace=False):
        r, t, _ = entries.biases[int(b)]
        entries.biases.append((r, t, float(case.rng.normal())))  # duplicates add up
    entries.biases.append((0, int(case.rng.integers(vocab)), -np.inf))
    case.rng.shuffle(entries.penalties)
    case.rng.shuffle(entries.biases)
    return entries


def check_adjust(case: Case, logits: np.ndarray, adj: LogitAdjustments, what: str) -> np.ndarray:
    """Run `adjust_logits` in place and compare with the oracle; untouched logits must be bit-exact."""
    logits_dev, before = case.upload(logits)
    want = oracle_adjust(before, adj)
    assert case.backend.adjust_logits(logits_dev, adj) is None, f"{what}: adjust_logits returns None {case.tag}"
    case.assert_close(logits_dev, want, what)
    after, mask = case.host(logits_dev), touched(adj, logits.shape)
    case.assert_equal(after[~mask], before[~mask], f"{what}: logits without an entry must not change")
    return after


# ---- tests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 37), (6, 50), (3, 1001)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_adjust_logits_matches_oracle(case: Case, shape: tuple[int, int]) -> None:
    rows, vocab = shape
    logits = case.normal(rows, vocab, scale=2.0)
    logits[:, :2] = 0.0  # exact zeros: repetition multiplies them (stays 0)
    entries = random_entries(case, rows, vocab)
    penalised = {(r, t) for r, t, _, _ in entries.penalties}
    entries.penalties += [(r, t, 1, True) for r in range(rows) for t in (0, 1) if (r, t) not in penalised]
    adj = entries.build()
    assert (adj.bias_values == -np.inf).any()
    assert len({*zip(adj.bias_rows, adj.bias_tokens, strict=True)}) < len(adj.bias_rows)
    check_adjust(case, logits, adj, f"adjust_logits {shape}")


def test_adjust_logits_sign_rules(case: Case) -> None:
    """Hand-computed values, exact in every activation dtype: positive logits are divided by the
    repetition penalty, others multiplied; presence and frequency count output occurrences only."""
    logits = np.array([[2.0, -2.0, 3.0, -1.0, 0.0, 4.0, 1.0], [2.0, -2.0, 3.0, -1.0, 0.0, 4.0, 1.0]], np.float32)
    entries = Entries(
        repetition=[2.0, 0.5],
        presence=[0.5, 0.0],
        frequency=[0.25, 1.0],
        penalties=[
            (0, 0, 0, True),
            (0, 1, 0, True),
            (0, 2, 2, False),
            (0, 3, 4, True),
            (0, 4, 1, False),
            (1, 0, 0, True),
            (1, 1, 2, True),
            (1, 2, 0, True),
        ],
        biases=[(0, 5, -1.5), (0, 5, 0.5), (1, 6, -np.inf), (1, 0, 0.25)],
    )
    want = np.array([[1.0, -4.0, 0.5, -3.5, -0.75, 3.0, 1.0], [4.25, -3.0, 6.0, -1.0, 0.0, 4.0, -np.inf]])
    got = check_adjust(case, logits, entries.build(), "adjust_logits sign rules")
    case.assert_values(got, want, "adjust_logits sign rules (hand-computed)")


def test_adjust_logits_without_entries_is_a_no_op(case: Case) -> None:
    rows, vocab = 5, 64
    logits = case.normal(rows, vocab, scale=3.0)
    logits[1, 3] = -np.inf
    adj = LogitAdjustments.none(rows)
    per_row = (adj.repetition_penalty, adj.presence_penalty, adj.frequency_penalty)
    assert adj.is_empty and all(len(x) == rows for x in per_row), f"LogitAdjustments.none({rows}) {case.tag}"
    logits_dev, before = case.upload(logits)
    case.backend.adjust_logits(logits_dev, adj)
    case.assert_equal(case.host(logits_dev), before, "adjust_logits with LogitAdjustments.none")
    neutral = random_entries(case, rows, vocab)
    neutral.repetition, neutral.presence, neutral.frequency = [1.0] * rows, [0.0] * rows, [0.0] * rows
    neutral.biases = []
    case.backend.adjust_logits(logits_dev, neutral.build())
    case.assert_equal(case.host(logits_dev), before, "adjust_logits with neutral penalties")


def test_banned_tokens_are_never_sampled(case: Case) -> None:
    """-inf biases on each row's argmax and random other ids, then `sample` at greedy and random
    knobs over many uniforms: never a banned id; greedy rows take the argmax of what is left."""
    rows, vocab = 8, 40
    logits = case.normal(rows, vocab, scale=2.0)
    banned = case.rng.random((rows, vocab)) < 0.25
    banned[np.arange(rows), logits.argmax(axis=1)] = True
    banned[np.arange(rows), case.rng.integers(vocab, size=rows)] = False
    entries = Entries(
        repetition=[1.0] * rows,
        presence=[0.0] * rows,
        frequency=[0.0] * rows,
        biases=[(int(r), int(t), -np.inf) for r, t in np.argwhere(banned)],
    )
    adjusted = check_adjust(case, logits, entries.build(), "adjust_logits bans")
    logits_dev = case.backend.from_numpy(adjusted.astype(np.float32))
    zeros = np.zeros(rows, dtype=np.float32)
    greedy = SamplingTensors(zeros, np.zeros(rows, dtype=np.int32), zeros + 1, zeros, zeros)
    case.assert_tokens(case.backend.sample(logits_dev, greedy), oracle_argmax(adjusted), "greedy after bans")
    draws = 200
    tiled = case.backend.from_numpy(np.repeat(adjusted, draws, axis=0).astype(np.float32))
    n = rows * draws
    params = SamplingTensors(
        temperature=case.rng.choice([0.5, 1.0, 4.0], size=n).astype(np.float32),
        top_k=case.rng.choice([0, 5, vocab], size=n).astype(np.int32),
        top_p=case.rng.choice([1.0, 0.9], size=n).astype(np.float32),
        min_p=case.rng.choice([0.0, 0.05], size=n).astype(np.float32),
        uniform=np.tile(np.linspace(0, 1, draws, endpoint=False), rows).astype(np.float32),
        top_n_sigma=case.rng.choice([0.0, 1.0, 3.0], size=n).astype(np.float32),
    )
    got = case.host(case.backend.sample(tiled, params)).reshape(rows, draws)
    hits = banned[np.arange(rows)[:, None], got]
    assert not hits.any(), f"sample drew banned ids {got[hits].tolist()} {case.tag}"
