"""`ForwardBatch`: one forward pass over a flattened varlen batch (prefill chunks and decode tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata


@dataclass
class ForwardBatch:
    """Inputs of one model forward.

    input_ids / positions: backend int32 arrays ``[T]`` (all sequences' new tokens, concatenated).
    attention: where each sequence's queries and KV live (backend arrays, see `AttentionMetadata`).
    logits_rows: host int array ``[S]``, the rows of the final hidden state to project to logits
    (one per sequence to sample, plus every prompt row whose prompt logprobs are asked for).
    state_slots: backend int32 ``[B]``, each sequence's recurrent-state slot (-1: none).
    is_pure_decode: every sequence contributes exactly one decode token (graph-capturable).
    """

    input_ids: Array
    positions: Array
    attention: AttentionMetadata
    logits_rows: np.ndarray
    state_slots: Array
    is_pure_decode: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
