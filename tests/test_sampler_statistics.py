"""Statistical behaviour of the reference sampler (`NumpyBackend.sample` and `adjust_logits`).

Each test draws one row at an evenly spaced grid of uniforms (the sampler is an inverse-CDF draw,
so the grid reproduces the filtered distribution exactly up to 1/N per token) and compares the set
of tokens ever drawn, or their frequencies, with quantities computed by hand from the logits.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.base import LogitAdjustments, SamplingTensors
from atlas_core.backends.numpy_backend import NumpyBackend

GRID = 5_000
BACKEND = NumpyBackend()
SEEDS = [11, 22]


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


def draws(
    row: np.ndarray,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    top_n_sigma: float = 0.0,
) -> np.ndarray:
    """The tokens drawn for ``GRID`` evenly spaced uniforms ``(i + 0.5) / GRID``."""

    def full(value: float, dtype: type) -> np.ndarray:
        return np.full(GRID, value, dtype=dtype)

    params = SamplingTensors(
        temperature=full(temperature, np.float32),
        top_k=full(top_k, np.int32),
        top_p=full(top_p, np.float32),
        min_p=full(min_p, np.float32),
        uniform=((np.arange(GRID) + 0.5) / GRID).astype(np.float32),
        top_n_sigma=full(top_n_sigma, np.float32),
    )
    tokens = BACKEND.sample(np.tile(row.astype(np.float32), (GRID, 1)), params)
    assert tokens.dtype == np.int32
    return tokens


def drawn_set(tokens: np.ndarray) -> set[int]:
    return {int(t) for t in np.unique(tokens)}


def frequencies(tokens: np.ndarray, vocab: int) -> np.ndarray:
    return np.bincount(tokens, minlength=vocab) / len(tokens)


def row_for(seed: int, vocab: int = 30, scale: float = 1.5) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * scale).astype(np.float32)


def assert_every_kept_token_reachable(probs: np.ndarray, kept: set[int]) -> None:
    """Test-data sanity: each kept token owns more than two grid cells once renormalised."""
    renormalised = probs[sorted(kept)] / probs[sorted(kept)].sum()
    assert renormalised.min() > 2 / GRID, "test data: a kept token is too unlikely for the grid"


# ---- filters ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
def test_top_p_keeps_exactly_the_nucleus(seed: int, top_p: float) -> None:
    row = row_for(seed)
    p = softmax(row)
    order = np.argsort(-p, kind="stable")
    cumulative = np.cumsum(p[order])
    assert np.abs(cumulative - np.float32(top_p)).min() > 1e-6, "test data: a prefix mass sits on top_p"
    size = int(np.argmax(cumulative >= np.float32(top_p))) + 1  # the smallest prefix reaching top_p
    nucleus = {int(t) for t in order[:size]}
    assert_every_kept_token_reachable(p, nucleus)
    tokens = draws(row, top_p=top_p)
    assert drawn_set(tokens) == nucleus
    want = np.zeros_like(p)
    want[order[:size]] = p[order[:size]] / p[order[:size]].sum()
    np.testing.assert_allclose(frequencies(tokens, len(row)), want, atol=2 / GRID)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.6])
def test_min_p_keeps_exactly_tokens_above_the_relative_threshold(seed: int, min_p: float) -> None:
    row = row_for(seed)
    p = softmax(row)
    threshold = np.float32(min_p) * p.max()
    assert np.abs(p - threshold).min() > 1e-9, "test data: a probability sits on the threshold"
    kept = {int(t) for t in np.flatnonzero(p >= threshold)}
    assert_every_kept_token_reachable(p, kept)
    assert drawn_set(draws(row, min_p=min_p)) == kept


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("top_k", [1, 3, 10])
def test_top_k_keeps_the_k_most_likely(seed: int, top_k: int) -> None:
    row = row_for(seed)
    p = softmax(row)
    kept = {int(t) for t in np.argsort(-row, kind="stable")[:top_k]}
    tokens = draws(row, top_k=top_k)
    assert drawn_set(tokens) == kept
    want = np.where(np.isin(np.arange(len(row)), list(kept)), p, 0.0)
    np.testing.assert_allclose(frequencies(tokens, len(row)), want / want.sum(), atol=2 / GRID)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_sigma", [0.5, 1.0, 2.0])
def test_top_n_sigma_keeps_tokens_within_n_std_of_the_max(seed: int, n_sigma: float) -> None:
    """The kept set is ``{z >= max(z) - n * std(z)}`` and, being scale-free, the same at any temperature."""
    row = row_for(seed)
    sigma = float(np.sqrt(np.mean((row - row.mean()) ** 2)))  # population std
    threshold = row.max() - np.float32(n_sigma) * sigma
    assert np.abs(row - threshold).min() > 1e-4, "test data: a logit sits on the threshold"
    kept = {int(t) for t in np.flatnonzero(row >= threshold)}
    for temperature in (0.5, 1.0, 2.0):
        assert_every_kept_token_reachable(softmax(row, temperature), kept)
        assert drawn_set(draws(row, temperature=temperature, top_n_sigma=n_sigma)) == kept, temperature


def test_filters_compose_in_order() -> None:
    """top-n-sigma, then top_k, then top_p renormalised over what is left, then min_p."""
    row = np.array([3.0, 2.6, 2.2, 1.0, 0.9, 0.5, -1.0, -2.0, -2.5, -3.0], dtype=np.float32)
    p = softmax(row)
    sigma = float(np.sqrt(np.mean((row - row.mean()) ** 2)))
    kept = list(np.flatnonzero(row >= row.max() - np.float32(1.2) * sigma))  # 1.2 sigma: ids 0..4
    assert kept == [0, 1, 2, 3, 4]
    kept = kept[:4]  # top_k = 4
    mass = np.cumsum(p[kept] / p[kept].sum())  # [0.44, 0.74, 0.94, 1]
    kept = kept[: int(np.argmax(mass >= np.float32(0.9))) + 1]  # top_p = 0.9 over the 4 left: ids 0..2
    assert kept == [0, 1, 2] and np.cumsum(p)[2] < 0.9  # over the whole row top_p would keep id 3 too
    assert drawn_set(draws(row, top_n_sigma=1.2, top_k=4, top_p=0.9, min_p=0.05)) == set(kept)
    assert drawn_set(draws(row, top_n_sigma=1.2, top_k=4, top_p=0.9, min_p=0.6)) == {0, 1}  # p >= 0.6 p_max
    assert drawn_set(draws(row, top_n_sigma=0.8, top_k=4)) == {0, 1, 2}  # the narrower filter wins


# ---- temperature --------------------------------------------------------------------------------
def entropy(freq: np.ndarray) -> float:
    nonzero = freq[freq > 0]
    return float(-(nonzero * np.log(nonzero)).sum())


@pytest.mark.parametrize("seed", SEEDS)
def test_temperature_sharpens_and_flattens(seed: int) -> None:
    row = row_for(seed, vocab=12, scale=1.0)
    observed = {}
    for temperature in (0.25, 0.5, 1.0, 2.0, 4.0):
        freq = frequencies(draws(row, temperature=temperature), len(row))
        np.testing.assert_allclose(freq, softmax(row, temperature), atol=2 / GRID)
        observed[temperature] = freq
    entropies = [entropy(observed[t]) for t in sorted(observed)]
    assert entropies == sorted(entropies), f"entropy must grow with the temperature: {entropies}"
    top = int(np.argmax(row))
    tops = [observed[t][top] for t in sorted(observed)]
    assert tops == sorted(tops, reverse=True), f"the argmax's share must shrink as temperature grows: {tops}"
    assert drawn_set(draws(row, temperature=0.01)) == {top}, "a very low temperature is greedy"
    flat = frequencies(draws(row, temperature=1000.0), len(row))
    np.testing.assert_allclose(flat, 1 / len(row), atol=1e-3, err_msg="a very high temperature is uniform")


# ---- penalties and biases -----------------------------------------------------------------------
def adjustments(
    rows: int,
    *,
    repetition: float = 1.0,
    presence: float = 0.0,
    frequency: float = 0.0,
    penalties: list[tuple[int, int, int, bool]] = (),
    biases: list[tuple[int, int, float]] = (),
) -> LogitAdjustments:
    adj = LogitAdjustments.none(rows)
    adj.repetition_penalty[:], adj.presence_penalty[:], adj.frequency_penalty[:] = repetition, presence, frequency
    if penalties:
        rows_, tokens, counts, in_prompt = zip(*penalties, strict=True)
        adj.penalty_rows, adj.penalty_tokens = np.int32(rows_), np.int32(tokens)
        adj.output_counts, adj.in_prompt = np.int32(counts), np.array(in_prompt, dtype=bool)
    if biases:
        rows_, tokens, values = zip(*biases, strict=True)
        adj.bias_rows, adj.bias_tokens, adj.bias_values = np.int32(rows_), np.int32(tokens), np.float32(values)
    return adj


@pytest.mark.parametrize("repetition", [0.5, 1.5, 3.0])
def test_repetition_penalty_changes_exactly_the_penalised_logits(repetition: float) -> None:
    """A penalty above 1 lowers every penalised logit (divides positives, multiplies negatives),
    below 1 raises it; prompt-only, output-only and both count alike; nothing else changes."""
    logits = np.random.default_rng(5).standard_normal((3, 40)).astype(np.float32) * 3
    entries = [(r, t, [0, 2, 1][t % 3], t % 3 != 1) for r in range(3) for t in range(r, 40, 4)]
    adjusted = logits.copy()
    BACKEND.adjust_logits(adjusted, adjustments(3, repetition=repetition, penalties=entries))
    mask = np.zeros(logits.shape, dtype=bool)
    mask[[e[0] for e in entries], [e[1] for e in entries]] = True
    np.testing.assert_array_equal(adjusted[~mask], logits[~mask])
    before, after = logits[mask], adjusted[mask]
    positive = before > 0
    np.testing.assert_allclose(after[positive], before[positive] / np.float32(repetition), rtol=1e-6)
    np.testing.assert_allclose(after[~positive], before[~positive] * np.float32(repetition), rtol=1e-6)
    lowered = after < before
    assert lowered.all() if repetition > 1 else not lowered.any()
    assert np.all(np.sign(after) == np.sign(before)), "the repetition penalty never flips a sign"


def test_presence_and_frequency_touch_output_tokens_only() -> None:
    logits = np.random.default_rng(6).standard_normal((2, 20)).astype(np.float32)
    entries = [(0, 3, 0, True), (0, 4, 1, False), (0, 5, 3, True), (1, 3, 2, False), (1, 9, 0, True)]
    adjusted = logits.copy()
    BACKEND.adjust_logits(adjusted, adjustments(2, presence=0.7, frequency=0.2, penalties=entries))
    expected = logits.copy()
    for r, t, count, _ in entries:
        expected[r, t] -= np.float32(0.2) * count + np.float32(0.7) * (count > 0)
    np.testing.assert_allclose(adjusted, expected, rtol=0, atol=1e-6)
    assert adjusted[0, 3] == logits[0, 3] and adjusted[1, 9] == logits[1, 9], "prompt-only tokens are untouched"
    drop = logits - adjusted
    assert drop[0, 5] > drop[0, 4] > 0, "more occurrences, larger penalty"


def test_penalised_token_is_drawn_less_often() -> None:
    row = np.array([2.0, 1.5, 1.0, 0.5, 0.0], dtype=np.float32)
    adjusted = row[None].copy()
    BACKEND.adjust_logits(adjusted, adjustments(1, repetition=2.0, frequency=0.5, penalties=[(0, 0, 2, True)]))
    assert adjusted[0, 0] == np.float32(0.0)  # 2 / 2 - 0.5 * 2
    before, after = frequencies(draws(row), 5), frequencies(draws(adjusted[0]), 5)
    np.testing.assert_allclose(after, softmax(adjusted[0]), atol=2 / GRID)
    assert after[0] < before[0] and np.all(after[1:] > before[1:])


@pytest.mark.parametrize("seed", SEEDS)
def test_banned_tokens_are_never_drawn(seed: int) -> None:
    row = row_for(seed, vocab=20)
    rng = np.random.default_rng(seed)
    banned = sorted({int(np.argmax(row))} | {int(t) for t in rng.choice(20, size=6, replace=False)})
    adjusted = row[None].copy()
    BACKEND.adjust_logits(adjusted, adjustments(1, biases=[(0, t, -np.inf) for t in banned] + [(0, banned[0], 1.0)]))
    assert np.isneginf(adjusted[0, banned]).all() and np.isfinite(np.delete(adjusted[0], banned)).all()
    allowed = np.delete(np.arange(20), banned)
    want = np.zeros(20)
    want[allowed] = softmax(row[allowed])
    for knobs in ({}, {"temperature": 3.0}, {"top_n_sigma": 1.0}, {"top_p": 0.9, "min_p": 0.01}, {"top_k": 50}):
        tokens = draws(adjusted[0], **knobs)
        assert not set(banned) & drawn_set(tokens), knobs
        if not knobs:
            np.testing.assert_allclose(frequencies(tokens, 20), want, atol=2 / GRID)
    assert BACKEND.argmax(adjusted)[0] == allowed[np.argmax(row[allowed])]
