"""Ops of the mla group with a host fallback (see `atlas_core.backends.ops`)."""

from __future__ import annotations


class MLAOps:
    """Mixin of `Backend`: the mla ops, each defaulting to its NumPy reference on the host."""
