"""What a decode step reads and writes for each sequence besides the weights: its KV cache and its
recurrent state, as the model describes them.

* KV cache. ``model.kv_layouts`` gives each cache slot's bytes per token (a `KVLayout`'s keys and
  values, or MLA's compressed latent row, `LatentKVLayout`). The attention layers say which slots
  they read and how far back: an attention layer is an object of the model with an integer
  ``layer_index`` (its cache slot) and a ``sliding_window`` attribute (None: the whole context), as
  `atlas_core.model.layers.attention.Attention` has. Each such layer reads ``min(context, window)``
  tokens of its slot per step (Gemma 4's KV-shared layers read their source's slot again); a slot no
  such layer claims (MLA, other mixers) is read whole, once. Every slot gets one token written.
* Recurrent state. ``model.state_bytes_per_slot()`` is one sequence's state over every recurrent
  layer (a gated delta net's convolution window and ``[Hv, Dk, Dv]`` float32 matrix, a Mamba-2
  mixer's convolution window and ``[Hm, P, N]`` float32 SSM state); a decode step reads it whole and
  writes it whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class KVRead:
    """One attention layer's reads: ``bytes_per_token`` of its cache slot, over at most ``window`` tokens."""

    bytes_per_token: int
    window: int | None = None

    def bytes(self, context: int) -> int:
        """Bytes read by one step of a sequence with ``context`` tokens in the cache."""
        return self.bytes_per_token * (context if self.window is None else min(context, self.window))


@dataclass(frozen=True)
class SequenceTraffic:
    """Per-sequence bytes of one decode step beyond the weights (see the module docstring)."""

    kv_reads: tuple[KVRead, ...] = ()
    kv_write_bytes: int = 0
    """One token written to every cache slot."""
    state_bytes: int = 0
    """One sequence's recurrent state, read and written once per step."""

    def step_bytes(self, context: int) -> int:
        """Bytes one decode step moves for one sequence whose cache holds ``context`` tokens."""
        return sum(read.bytes(context) for read in self.kv_reads) + self.kv_write_bytes + 2 * self.state_bytes

    def mean_step_bytes(self, first_context: int, steps: int) -> float:
        """Mean of `step_bytes` over ``steps`` decode steps at contexts ``first_context``, ``+1``, ..."""
        if steps <= 0:
            return float(self.step_bytes(first_context))
        return sum(self.step_bytes(first_context + i) for i in range(steps)) / steps


def sequence_traffic(model: Any, objects: list[Any], kv_layouts: Sequence[Any] | None = None) -> SequenceTraffic:
    """The `SequenceTraffic` of ``model``, whose attention layers are among ``objects`` (every object
    reachable from it, `atlas_core.bench.roofline.model_weights`). ``kv_layouts``: the layouts as the
    engine stores them (their ``dtype``, e.g. fp8 under ``kv_cache_dtype``); None: the model's, in the
    backend's activation dtype."""
    default = np.dtype(model.backend.activation_dtype)
    layouts = getattr(model, "kv_layouts", []) if kv_layouts is None else kv_layouts
    per_token = [int(layout.bytes_per_token(np.dtype(getattr(layout, "dtype", None) or default))) for layout in layouts]
    reads: list[KVRead] = []
    claimed: set[int] = set()
    for obj in objects:
        slot = getattr(obj, "layer_index", None)
        if not hasattr(obj, "sliding_window") or not isinstance(slot, int) or not 0 <= slot < len(per_token):
            continue
        reads.append(KVRead(per_token[slot], obj.sliding_window))
        claimed.add(slot)
    reads += [KVRead(size) for slot, size in enumerate(per_token) if slot not in claimed]
    state = model.state_bytes_per_slot() if hasattr(model, "state_bytes_per_slot") else 0
    return SequenceTraffic(tuple(reads), sum(per_token), int(state))
