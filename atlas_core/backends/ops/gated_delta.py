"""Ops of the gated_delta group with a host fallback (see `atlas_core.backends.ops`)."""

from __future__ import annotations


class GatedDeltaOps:
    """Mixin of `Backend`: the gated_delta ops, each defaulting to its NumPy reference on the host."""
