"""Rotary position embedding frequencies for the RoPE variants of Hugging Face configs.

Supported ``rope_type`` values: ``default``, ``linear``, ``llama3``, ``yarn`` (with mscale /
attention factor), ``proportional`` (Gemma 4's global layers), plus partial rotary through
``partial_rotary_factor``. Math follows
``transformers.modeling_rope_utils`` so tables match the reference checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas_core.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


@dataclass(frozen=True)
class RopeSpec:
    """What a config says about RoPE, normalised across transformers' old and new key names."""

    theta: float
    rotary_dim: int
    rope_type: str = "default"
    scaling: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 2048

    @classmethod
    def from_config(cls, config: dict[str, Any], head_dim: int) -> RopeSpec:
        """Read ``rope_parameters`` (transformers ≥ 5) or ``rope_theta`` + ``rope_scaling``."""
        params = dict(config.get("rope_parameters") or {})
        scaling = dict(config.get("rope_scaling") or {})
        merged = {**scaling, **params}
        theta = float(merged.get("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = str(merged.get("rope_type", merged.get("type", "default")))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"config.json: rope_type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        partial = float(merged.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))
        return cls(
            theta=theta,
            # proportional RoPE spans the whole head: its unrotated pairs get zero frequencies instead
            rotary_dim=head_dim if rope_type == "proportional" else int(head_dim * partial),
            rope_type=rope_type,
            scaling=merged,
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        )


def inverse_frequencies(spec: RopeSpec) -> tuple[np.ndarray, float]:
    """Return ``(inv_freq[rotary_dim / 2], attention_factor)`` for the spec's rope type."""
    dim = spec.rotary_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    inv_freq = 1.0 / (spec.theta**exponents)
    if spec.rope_type == "linear":
        return inv_freq / float(spec.scaling["factor"]), 1.0
    if spec.rope_type == "llama3":
        return _llama3(inv_freq, spec.scaling), 1.0
    if spec.rope_type == "yarn":
        return _yarn(spec)
    if spec.rope_type == "proportional":
        return _proportional(spec), 1.0
    return inv_freq, 1.0


def _proportional(spec: RopeSpec) -> np.ndarray:
    """Gemma 4's proportional RoPE: the first ``partial_rotary_factor * head_dim / 2`` frequencies
    are the default ones of the full head dim, the remaining ones are 0 (those pairs are not rotated),
    all divided by ``factor``."""
    head_dim = spec.rotary_dim
    rotated = int(float(spec.scaling.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    exponents = np.arange(0, 2 * rotated, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = np.zeros(head_dim // 2, dtype=np.float32)
    inv_freq[:rotated] = 1.0 / (spec.theta**exponents)
    return inv_freq / float(spec.scaling.get("factor", 1.0))


def _llama3(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(spec: RopeSpec) -> tuple[np.ndarray, float]:
    scaling, dim, base = spec.scaling, spec.rotary_dim, spec.theta
    original = float(scaling.get("original_max_position_embeddings") or spec.max_position_embeddings)
    factor = float(scaling.get("factor") or spec.max_position_embeddings / original)
    attention_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def mscale_softmax_factor(spec: RopeSpec) -> float:
    """DeepSeek's softmax-scale correction for scaled RoPE: ``(0.1 * mscale_all_dim * ln(factor) + 1) ** 2``
    when the rope type is not ``default`` and ``mscale_all_dim`` is set (non-zero), else 1. The
    attention layer multiplies its ``head_dim ** -0.5`` by it (transformers' ``yarn_apply_mscale``)."""
    mscale_all_dim = spec.scaling.get("mscale_all_dim")
    if spec.rope_type == "default" or not mscale_all_dim:
        return 1.0
    return _yarn_mscale(float(spec.scaling["factor"]), float(mscale_all_dim)) ** 2


def rotary_tables(spec: RopeSpec, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` tables ``[max_positions, rotary_dim / 2]`` float32, attention factor applied."""
    inv_freq, attention_factor = inverse_frequencies(spec)
    angles = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    return (np.cos(angles) * attention_factor).astype(np.float32), (np.sin(angles) * attention_factor).astype(
        np.float32
    )
