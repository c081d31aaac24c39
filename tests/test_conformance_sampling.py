"""Backend conformance: ``sample`` (greedy rows, degenerate filters, exact draws against an
inverse-CDF oracle, banned (-inf) tokens, and the sampled distribution) against float64 oracles.

Fixtures, tolerances, the seed handling (``ATLAS_CONFORMANCE_SEED``) and the oracles shared with
other modules are in ``atlas_core.testing`` (``conformance``, ``oracles``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from atlas_core.backends.base import SamplingTensors
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.oracles import oracle_argmax, tie_rows


# ---- float64 oracles -----------------------------------------------------------------------------
def _f32(value: float) -> float:
    return float(np.float32(value))


@dataclass(frozen=True)
class Knobs:
    """One row's sampling parameters (the defaults switch every filter off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    top_n_sigma: float = 0.0

    def as_float32(self) -> Knobs:
        """The values the backend sees (SamplingTensors carries float32)."""
        return Knobs(_f32(self.temperature), self.top_k, _f32(self.top_p), _f32(self.min_p), _f32(self.top_n_sigma))


def oracle_std(values: list[float]) -> float:
    """Population standard deviation."""
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def oracle_kept(row: np.ndarray, knobs: Knobs) -> tuple[list[int], np.ndarray, float]:
    """Token ids kept by the filters in draw order (descending probability, ties by lower id), their
    renormalised probabilities, and the smallest distance of any filter decision to its threshold
    (in scaled-logit units for top-n-sigma, in probability mass for the others). Filter order:
    top-n-sigma, top_k, top_p (renormalised over what is left), min_p. -inf logits are banned tokens:
    probability 0, and left out of the top-n-sigma standard deviation."""
    knobs = knobs.as_float32()
    scaled = row / knobs.temperature
    p = np.exp(scaled - scaled.max())
    p /= p.sum()
    order = sorted(range(len(row)), key=lambda j: (-row[j], j))
    keep, closest = len(order), np.inf
    if knobs.top_n_sigma > 0.0:
        finite = [float(z) for z in scaled if np.isfinite(z)]
        threshold = max(finite) - knobs.top_n_sigma * oracle_std(finite)
        keep = sum(1 for j in order if scaled[j] >= threshold)
        closest = min([closest] + [abs(z - threshold) for z in finite])
    if knobs.top_k > 0:
        keep = min(keep, knobs.top_k)
    if knobs.top_p < 1.0:
        mass, prefix = 0.0, 0
        total = sum(p[j] for j in order[:keep])  # top_p applies to the distribution top_k left
        for j in order[:keep]:  # the smallest prefix whose mass reaches top_p, the crossing token included
            mass, prefix = mass + p[j] / total, prefix + 1
            closest = min(closest, abs(mass - knobs.top_p))
            if mass >= knobs.top_p:
                break
        keep = min(keep, prefix)
    if knobs.min_p > 0.0:
        threshold = knobs.min_p * p[order[0]]
        keep = min(keep, sum(1 for j in order if p[j] >= threshold))
        closest = min([closest] + [abs(p[j] - threshold) for j in order[1:]])
    kept = order[:keep]
    return kept, p[kept] / p[kept].sum(), closest


def oracle_draw(kept: list[int], probs: np.ndarray, uniform: float) -> tuple[int, float]:
    """Inverse CDF: the first kept token whose cumulative mass exceeds ``uniform``; and the margin."""
    mass, closest = 0.0, np.inf
    for token, prob in zip(kept, probs, strict=True):
        mass += prob
        closest = min(closest, abs(mass - uniform))
        if mass > uniform:
            return token, closest
    return kept[-1], closest


def sampling_tensors(rows: int, knobs: list[Knobs] | Knobs, uniform: np.ndarray) -> SamplingTensors:
    per_row = knobs if isinstance(knobs, list) else [knobs] * rows
    return SamplingTensors(
        temperature=np.asarray([k.temperature for k in per_row], dtype=np.float32),
        top_k=np.asarray([k.top_k for k in per_row], dtype=np.int32),
        top_p=np.asarray([k.top_p for k in per_row], dtype=np.float32),
        min_p=np.asarray([k.min_p for k in per_row], dtype=np.float32),
        uniform=np.asarray(uniform, dtype=np.float32),
        top_n_sigma=np.asarray([k.top_n_sigma for k in per_row], dtype=np.float32),
    )


# ---- input builders ------------------------------------------------------------------------------
def unique_max_rows(case: Case, rows: int, vocab: int) -> np.ndarray:
    logits = case.normal(rows, vocab, scale=2.0)
    logits[np.arange(rows), logits.argmax(axis=1)] += 1.0
    return logits


# ---- sampling ------------------------------------------------------------------------------------
def random_knobs(case: Case, vocab: int, *, greedy: bool) -> Knobs:
    def pick(options: list) -> float:
        return options[int(case.rng.integers(len(options)))]

    return Knobs(
        temperature=0.0 if greedy else pick([0.5, 1.0, 1.7]),
        top_k=pick([0, 1, 4, vocab + 3]),
        top_p=pick([1.0, 0.95, 0.6]),
        min_p=pick([0.0, 0.02, 0.2]),
        top_n_sigma=pick([0.0, 0.0, 0.5, 1.5, 3.0]),
    )


def test_sample_greedy_rows_are_argmax(case: Case) -> None:
    rows, vocab = 12, 64
    logits_dev, logits = case.upload(np.concatenate([case.normal(rows // 2, vocab), tie_rows(case, rows // 2, vocab)]))
    greedy = np.arange(rows) % 2 == 0
    knobs = [random_knobs(case, vocab, greedy=bool(g)) for g in greedy]
    params = sampling_tensors(rows, knobs, case.rng.random(rows))
    with case.unchanged("sample", logits=logits_dev):
        got = case.raw(case.backend.sample(logits_dev, params))
    assert got.dtype == np.int32, f"sample: dtype {got.dtype}, expected int32 {case.tag}"
    want = oracle_argmax(logits)[greedy]
    case.assert_equal(got[greedy].astype(np.int64), want, "sample: temperature 0 rows must be argmax")


ARGMAX_KNOBS: dict[str, tuple[dict[str, float], bool]] = {  # knob -> (Knobs overrides, include tied rows)
    "top_k_1": ({"top_k": 1}, True),
    "top_p_tiny": ({"top_p": 1e-6}, True),
    "min_p_1": ({"min_p": 1.0}, False),  # a tied maximum would legitimately keep every tied id
    "top_n_sigma_tiny": ({"top_n_sigma": 1e-6}, False),  # likewise
}


@pytest.mark.parametrize("knob", list(ARGMAX_KNOBS))
def test_sample_degenerate_filters_give_argmax(case: Case, knob: str) -> None:
    overrides, with_ties = ARGMAX_KNOBS[knob]
    rows, vocab = 16, 50
    parts = [unique_max_rows(case, rows, vocab)] + ([tie_rows(case, rows, vocab)] if with_ties else [])
    logits_dev, logits = case.upload(np.concatenate(parts))
    total = len(logits)
    knobs = [Knobs(temperature=float(case.rng.choice([0.3, 1.0, 3.0])), **overrides) for _ in range(total)]
    uniform = np.concatenate([[0.0, np.float32(1.0 - 2**-24)], case.rng.random(total - 2)])
    got = case.backend.sample(logits_dev, sampling_tensors(total, knobs, uniform))
    case.assert_tokens(got, oracle_argmax(logits), f"sample with {knob} must give argmax (lowest id on ties)")


def check_against_inverse_cdf_oracle(case: Case, logits: np.ndarray, what: str) -> None:
    """Random filters per row; draws whose token depends on a comparison closer than ``tol.margin``
    to its threshold are redrawn so the exact-token check is robust to rounding."""
    rows, vocab = logits.shape
    logits_dev, logits = case.upload(logits)
    knobs, uniform, want = [], np.zeros(rows, dtype=np.float32), np.zeros(rows, dtype=np.int64)
    for r in range(rows):
        for _ in range(1000):
            row_knobs, u = random_knobs(case, vocab, greedy=False), np.float32(case.rng.random())
            kept, probs, filter_margin = oracle_kept(logits[r], row_knobs)
            token, draw_margin = oracle_draw(kept, probs, float(u))
            if min(filter_margin, draw_margin) > case.tol.margin:
                break
        else:
            pytest.fail(f"no unambiguous sampling draw for row {r} {case.tag}")
        knobs.append(row_knobs)
        uniform[r], want[r] = u, token
    got = case.backend.sample(logits_dev, sampling_tensors(rows, knobs, uniform))
    case.assert_tokens(got, want, f"{what} (knobs={knobs}, uniform={uniform.tolist()})")


def test_sample_matches_inverse_cdf_oracle(case: Case) -> None:
    check_against_inverse_cdf_oracle(case, case.normal(32, 48, scale=2.0), "sample vs inverse-CDF oracle")


def test_sample_with_banned_tokens(case: Case) -> None:
    """-inf logits (tokens banned by an `adjust_logits` bias) have probability 0 under every filter
    and are left out of the top-n-sigma standard deviation."""
    rows, vocab = 24, 40
    logits = case.normal(rows, vocab, scale=2.0)
    banned = case.rng.random((rows, vocab)) < 0.3
    banned[np.arange(rows), case.rng.integers(0, vocab, size=rows)] = False  # at least one allowed id per row
    logits[banned] = -np.inf
    check_against_inverse_cdf_oracle(case, logits, "sample with banned (-inf) tokens vs inverse-CDF oracle")


def test_sample_top_n_sigma_defaults_to_off(case: Case) -> None:
    """`SamplingTensors` built without top_n_sigma (callers that predate it) sample as with zeros."""
    rows, vocab = 16, 30
    logits_dev, _ = case.upload(case.normal(rows, vocab, scale=2.0))
    knobs = [replace(random_knobs(case, vocab, greedy=False), top_n_sigma=0.0) for _ in range(rows)]
    explicit = sampling_tensors(rows, knobs, case.rng.random(rows))
    implicit = SamplingTensors(explicit.temperature, explicit.top_k, explicit.top_p, explicit.min_p, explicit.uniform)
    assert implicit.top_n_sigma is not None and not implicit.top_n_sigma.any(), f"default must be zeros {case.tag}"
    want = case.raw(case.backend.sample(logits_dev, explicit)).astype(np.int64)
    case.assert_tokens(case.backend.sample(logits_dev, implicit), want, "sample with top_n_sigma omitted")


# Quarter-integers: exact in every activation dtype, so the oracle needs no read-back. The knobs
# below each cut the row at least 5e-3 away from a threshold (asserted in the test).
DISTRIBUTION_LOGITS = np.array([1.0, 2.5, -0.5, 0.75, 2.0, -1.5, 0.0, 1.5, -3.0, 0.25], dtype=np.float32)
DISTRIBUTION_KNOBS = {
    "plain": Knobs(),
    "temperature": Knobs(temperature=0.6),
    "top_k": Knobs(top_k=3),
    "top_p": Knobs(top_p=0.8),
    "min_p": Knobs(min_p=0.14),
    "combined": Knobs(temperature=1.3, top_k=6, top_p=0.88, min_p=0.22),
    "top_n_sigma": Knobs(top_n_sigma=0.93),  # keeps 3 ids; the sample std (ddof=1) would keep 4
    "top_n_sigma_temperature": Knobs(temperature=0.6, top_n_sigma=1.2),
    "top_n_sigma_then_top_k": Knobs(temperature=1.4, top_n_sigma=1.5, top_k=4),
    # top-n-sigma keeps 5 ids; top_p renormalised over those keeps 4 (over the whole row it would keep 5)
    "top_n_sigma_combined": Knobs(temperature=1.3, top_n_sigma=1.2, top_k=7, top_p=0.85, min_p=0.08),
}


@pytest.mark.parametrize("name", list(DISTRIBUTION_KNOBS))
def test_sample_distribution(case: Case, name: str) -> None:
    """10,000 evenly spaced uniforms over one row reproduce the filtered, renormalised softmax."""
    knobs, draws = DISTRIBUTION_KNOBS[name], 10_000
    kept, probs, margin = oracle_kept(DISTRIBUTION_LOGITS.astype(np.float64), knobs)
    assert margin > 5e-3, f"test data too close to a filter threshold ({margin})"
    want = np.zeros(len(DISTRIBUTION_LOGITS))
    want[kept] = probs
    logits_dev = case.backend.from_numpy(np.tile(DISTRIBUTION_LOGITS, (draws, 1)))
    uniform = np.arange(draws) / draws
    got = case.host(case.backend.sample(logits_dev, sampling_tensors(draws, knobs, uniform)))
    assert got.min() >= 0 and got.max() < len(want), f"token ids out of range {case.tag}"
    frequencies = np.bincount(got, minlength=len(want)) / draws
    np.testing.assert_allclose(
        frequencies, want, rtol=0, atol=case.tol.mass, err_msg=f"sample distribution ({name}, {knobs}) {case.tag}"
    )
