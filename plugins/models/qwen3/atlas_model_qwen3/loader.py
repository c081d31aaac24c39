"""Qwen3 dense: per-head RMSNorm on q and k before RoPE; head_dim and attention_bias from the config."""

from __future__ import annotations

from atlas_core.model.loader import DenseDecoderLoader


class Qwen3Loader(DenseDecoderLoader):
    spec_overrides = {"qk_norm": True}
