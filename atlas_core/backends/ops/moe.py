"""Ops of the moe group with a host fallback (see `atlas_core.backends.ops`)."""

from __future__ import annotations


class MoEOps:
    """Mixin of `Backend`: the moe ops, each defaulting to its NumPy reference on the host."""
