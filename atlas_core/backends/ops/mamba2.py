"""Ops of the mamba2 group with a host fallback (see `atlas_core.backends.ops`)."""

from __future__ import annotations


class Mamba2Ops:
    """Mixin of `Backend`: the mamba2 ops, each defaulting to its NumPy reference on the host."""
