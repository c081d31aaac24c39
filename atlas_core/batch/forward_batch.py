"""`ForwardBatch`: one forward pass over a flattened varlen batch (prefill chunks and decode tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata


@dataclass
class VisualRows:
    """Image features of one batch: ``embeds[n, H]`` replace the input embeddings of batch rows
    ``rows[n]`` (backend int32, the image placeholder tokens), and ``deepstack[i][n, H]`` is added to
    the same rows of the residual stream after decoder layer ``i`` (Qwen3-VL's deepstack; empty for
    towers without it)."""

    rows: Array
    embeds: Array
    deepstack: list[Array]


@dataclass
class ForwardBatch:
    """Inputs of one model forward.

    input_ids / positions: backend int32 arrays ``[T]`` (all sequences' new tokens, concatenated).
    attention: where each sequence's queries and KV live (backend arrays, see `AttentionMetadata`).
    logits_rows: host int array ``[S]``, the rows of the final hidden state to project to logits
    (one per sequence to sample, plus every prompt row whose prompt logprobs are asked for).
    state_slots: backend int32 ``[B]``, each sequence's recurrent-state slot (-1: none).
    state_checkpoints: backend int32 ``[T]`` or None: the state slot that also receives each token's sequence
    state after that token (-1: none; `atlas_core.backends.ops.checkpoints`), for the draft positions of
    speculative decoding's verify steps on hybrid models.
    is_pure_decode: every sequence contributes exactly one decode token (graph-capturable).
    tokens_per_seq: every sequence contributes this many tokens, at least 2 (a decode token and its
    drafts, a recompute after preemption, a short prefill chunk): graph-capturable; 0: not so.
    input_hidden: MTP layers (`atlas_core.model.mtp`): the target's final hidden state ``[T, H]`` that
    each token is read with (None for a model's own forward).
    visual: image features to place into this batch's rows (None: a text-only batch).
    rope_rows: multimodal RoPE (M-RoPE) of a batch with image tokens: per-token ``(cos, sin)`` rows
    ``[T, R/2]`` (float32) and the row indices ``arange(T)`` (int32), which replace ``positions`` and the
    layers' own tables for this batch (`rotary`). None: ``positions`` index the tables.
    host_inputs: the host int32 arrays the batch's ``input_ids``, ``positions``, ``query_start_loc``,
    ``seq_lens``, ``block_tables``, ``slot_mapping`` and ``state_slots`` were uploaded from, in that order, when
    the engine built it on the host (a split replica posts these instead of reading the device arrays back);
    None: read them from the device. The token ids are None when they exist only on the device: a decode step
    queued ahead (`atlas_core.engine.ahead`) runs on the tokens the step before it sampled there.
    """

    input_ids: Array
    positions: Array
    attention: AttentionMetadata
    logits_rows: np.ndarray
    state_slots: Array
    is_pure_decode: bool = False
    tokens_per_seq: int = 0
    input_hidden: Array | None = None
    visual: VisualRows | None = None
    rope_rows: tuple[Array, Array, Array] | None = None
    host_inputs: tuple[np.ndarray | None, ...] | None = None
    state_checkpoints: Array | None = None

    def rotary(self, cos: Array, sin: Array) -> tuple[Array, Array, Array]:
        """``(positions, cos, sin)`` for `Backend.rope` of a layer whose tables are ``cos`` / ``sin``: the
        batch's per-token M-RoPE rows when it has them, else ``positions`` into the layer's tables."""
        if self.rope_rows is None:
            return self.positions, cos, sin
        cos_rows, sin_rows, rows = self.rope_rows
        return rows, cos_rows, sin_rows

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
