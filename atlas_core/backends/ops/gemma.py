"""Ops of the gemma group with a host fallback (see `atlas_core.backends.ops`)."""

from __future__ import annotations


class GemmaOps:
    """Mixin of `Backend`: the gemma ops, each defaulting to its NumPy reference on the host."""
