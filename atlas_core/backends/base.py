"""The backend contract: arrays, memory and every op the layers call.

``docs/ops.md`` is the human-readable form of this contract. The NumPy backend is its executable
specification; the conformance suite (`tests/test_conformance_*.py`, shared fixtures and oracles in
`tests/conformance_support.py`) checks every installed backend (NumPy included) against independent
float64 oracles written from this contract.

Conventions for every op:
  * Shapes use T = tokens in the flattened batch, B = sequences, H = hidden size,
    Hq / Hk = query / key-value heads, D = head dim, V = vocab size.
  * Activations are in ``activation_dtype``; weights were uploaded through ``from_numpy`` and may
    be stored in another dtype; accumulation is at least fp32. Index arrays are int32.
  * ``out=`` (where offered) receives the result and is also returned; it must have the result's
    shape and dtype and must not alias an input. Without ``out`` a new array is returned.
  * Ops never synchronise with the host unless their result is a host value (``to_numpy``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = Any
"""A backend's array type (``numpy.ndarray`` for the reference, ``cupy.ndarray`` on CUDA)."""


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
    """

    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters for `Backend.sample`, host NumPy arrays of length S.

    temperature float32 (0 = greedy), top_k int32 (0 = off), top_p float32 (1 = off),
    min_p float32 (0 = off), uniform float32 in [0, 1): the row's random draw, made by the
    host from the request's own generator so a seed gives the same tokens batched or alone.
    """

    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    uniform: np.ndarray


class Backend(ABC):
    """Abstract array backend. Subclasses implement every abstract op with the documented contract."""

    name: str = "abstract"
    activation_dtype: np.dtype = np.dtype(np.float32)

    @classmethod
    def availability(cls) -> str | None:
        """None when this backend can run here, else a sentence saying why not."""
        return None

    # ---- memory -------------------------------------------------------------------------
    @abstractmethod
    def from_numpy(self, array: np.ndarray, *, weight: bool = False, dtype: np.dtype | None = None) -> Array:
        """Copy a host array to the backend. ``dtype`` forces the stored dtype; otherwise
        ``weight=True`` stores floats in the backend's weight dtype, other floats become
        ``activation_dtype``, and integers int32."""

    @abstractmethod
    def to_numpy(self, x: Array) -> np.ndarray:
        """Copy to the host (synchronises)."""

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type) -> Array:
        """A zero-filled array."""

    # ---- ops ----------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, weight: Array, ids: Array) -> Array:
        """Rows of ``weight[V, H]`` for ``ids[T]`` -> ``[T, H]`` activations."""

    @abstractmethod
    def linear(self, x: Array, weight: Array, bias: Array | None = None, out: Array | None = None) -> Array:
        """``x[T, K] @ weight[N, K].T (+ bias[N])`` -> ``[T, N]``."""

    @abstractmethod
    def rms_norm(
        self, x: Array, weight: Array, eps: float, residual: Array | None = None
    ) -> tuple[Array, Array]:
        """Fused residual add + RMSNorm over the last axis.

        ``s = x + residual`` (or ``x`` when residual is None); returns
        ``(s / sqrt(mean(s**2) + eps) * weight, s)``. The second result is the new residual stream.
        Works for any leading shape (``[T, H]`` or per-head ``[T, heads, D]``).
        """

    @abstractmethod
    def silu_mul(self, x: Array, out: Array | None = None) -> Array:
        """SwiGLU activation: ``x[T, 2I]`` = [gate | up] -> ``silu(gate) * up`` ``[T, I]``."""

    @abstractmethod
    def rope(self, q: Array, k: Array, positions: Array, cos: Array, sin: Array) -> None:
        """Rotary embedding in place, rotate-half (NeoX) layout, on the first ``2 * cos.shape[1]``
        dims of each head. ``q[T, Hq, D]``, ``k[T, Hk, D]``, ``positions[T]``,
        ``cos``/``sin`` ``[max_positions, R/2]`` float32 tables (scaling already applied)."""

    @abstractmethod
    def write_kv(self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array) -> None:
        """Store ``k``/``v`` ``[T, Hk, D]`` into caches ``[num_blocks, block_size, Hk, D]`` at flat
        slots ``slot_mapping[T]``; a slot of -1 skips that token."""

    @abstractmethod
    def attention(
        self, q: Array, k_cache: Array, v_cache: Array, meta: AttentionMetadata, scale: float,
        out: Array | None = None,
    ) -> Array:
        """Causal paged attention with GQA (``Hq`` a multiple of ``Hk``) for a varlen batch mixing
        prefill chunks and decode tokens. ``q[T, Hq, D]`` -> ``[T, Hq, D]``; keys and values are
        read from the caches (this step's tokens must already be written)."""

    @abstractmethod
    def log_softmax(self, logits: Array) -> Array:
        """Row-wise log-softmax of ``[S, V]`` in float32."""

    @abstractmethod
    def argmax(self, logits: Array) -> Array:
        """Row-wise argmax ``[S, V]`` -> int32 ``[S]`` (lowest index on ties)."""

    @abstractmethod
    def sample(self, logits: Array, params: SamplingTensors) -> Array:
        """Draw one token per row ``[S, V]`` -> int32 ``[S]``.

        Per row: temperature 0 -> argmax. Otherwise ``p = softmax(logits / T)``; keep the top_k
        most likely (ties by lower id), then the smallest prefix of those (renormalised) whose mass
        reaches top_p (the token crossing it included), then tokens with ``p >= min_p * max(p)``;
        renormalise and return the token where the cumulative mass (in descending-probability
        order, ties by lower id) first exceeds ``uniform * total``.
        """
