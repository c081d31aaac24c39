"""A `ForwardBatch` as one rendezvous message, so that every rank of a split replica runs rank 0's batch.

The message carries the batch's arrays as host copies and re-uploads each with the dtype it had on rank 0,
so every rank reads bitwise the same inputs: the token ids and positions, the attention metadata (with
``visible_end`` when image rows look ahead), the rows to project, the recurrent-state slots, and, when the
batch has them, the image features (`VisualRows`: rows, embeddings, deepstack features), the M-RoPE rows
and the target's hidden states that an MTP layer reads (``input_hidden``), and the recurrent-state checkpoints of a
hybrid model's verify step (``state_checkpoints``). Rank 0 alone prepares and
encodes images; the other ranks never run a vision tower, they place the features they are sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata, Backend
from atlas_core.batch.forward_batch import ForwardBatch, VisualRows

BATCH_ARRAYS = ("input_ids", "positions", "query_start_loc", "seq_lens", "block_tables", "slot_mapping", "state_slots")
"""The backend arrays every posted batch has, in message order and in `ForwardBatch.host_inputs`' order (its host
``logits_rows`` follows them, then the optional arrays the header's ``extras`` names)."""

ROPE_ROWS = ("rope_cos", "rope_sin", "rope_rows")
"""Wire names of `ForwardBatch.rope_rows`'s three arrays."""


def batch_extras(batch: ForwardBatch) -> dict[str, Array]:
    """The optional backend arrays ``batch`` has, by wire name (``visible_end``, ``visual_rows``,
    ``visual_embeds``, ``deepstack_<i>``, the `ROPE_ROWS`, ``input_hidden``, ``state_checkpoints``), in message
    order."""
    extras: dict[str, Array] = {}
    if batch.attention.visible_end is not None:
        extras["visible_end"] = batch.attention.visible_end
    if batch.visual is not None:
        extras["visual_rows"], extras["visual_embeds"] = batch.visual.rows, batch.visual.embeds
        extras |= {f"deepstack_{i}": features for i, features in enumerate(batch.visual.deepstack)}
    if batch.rope_rows is not None:
        extras |= dict(zip(ROPE_ROWS, batch.rope_rows, strict=True))
    if batch.input_hidden is not None:
        extras["input_hidden"] = batch.input_hidden
    if batch.state_checkpoints is not None:
        extras["state_checkpoints"] = batch.state_checkpoints
    return extras


def ids_from_rank_0(header: dict[str, Any]) -> bool:
    """Whether a posted batch's token ids are not in its message but on rank 0's device only (a decode step queued
    ahead, `atlas_core.engine.ahead`): every rank then takes them from rank 0's broadcast into ``input_ids``
    before the forward, in place of the zeros sent."""
    return bool(header.get("ids_from_rank_0", False))


def encode_batch(backend: Backend, batch: ForwardBatch) -> tuple[dict[str, Any], list[np.ndarray]]:
    """``batch`` as one message: a header and host arrays (`decode_batch` reverses it). The `BATCH_ARRAYS` are
    the batch's ``host_inputs`` when it has them (no reads from the device); token ids known on the device only
    are sent as zeros, and the header says so (`ids_from_rank_0`)."""
    meta = batch.attention
    on_device = batch.host_inputs is not None and batch.host_inputs[0] is None
    if batch.host_inputs is not None:
        positions = batch.host_inputs[1]
        assert positions is not None  # only the token ids may be missing
        arrays = [np.zeros_like(positions) if a is None else a for a in batch.host_inputs]
    else:
        device = [batch.input_ids, batch.positions, meta.query_start_loc, meta.seq_lens, meta.block_tables]
        device += [meta.slot_mapping, batch.state_slots]
        arrays = [np.asarray(backend.to_numpy(array)) for array in device]
    extras = batch_extras(batch)
    arrays.append(np.asarray(batch.logits_rows))
    arrays += [np.asarray(backend.to_numpy(array)) for array in extras.values()]
    header = {"is_pure_decode": batch.is_pure_decode, "tokens_per_seq": batch.tokens_per_seq, "extras": list(extras)}
    return header | ({"ids_from_rank_0": True} if on_device else {}), arrays


def decode_batch(backend: Backend, header: dict[str, Any], arrays: list[np.ndarray]) -> ForwardBatch:
    """The `ForwardBatch` that `encode_batch` sent, its arrays uploaded to ``backend`` in their sent dtypes (the
    int32 `BATCH_ARRAYS` together, `Backend.upload_int32`), with the `BATCH_ARRAYS` kept as its ``host_inputs``
    (the ids as None when they come from rank 0's broadcast)."""

    def upload(array: np.ndarray) -> Array:
        return backend.from_numpy(array, dtype=array.dtype)

    count = len(BATCH_ARRAYS)
    host = tuple(arrays[:count])
    if all(array.dtype == np.int32 for array in host):
        ids, positions, starts, seq_lens, tables, slots, state_slots = backend.upload_int32(host)
    else:
        ids, positions, starts, seq_lens, tables, slots, state_slots = (upload(a) for a in host)
    names = list(header.get("extras", []))
    extras = {name: upload(array) for name, array in zip(names, arrays[count + 1 :], strict=True)}
    visual = None
    if "visual_rows" in extras:
        depth = sum(name.startswith("deepstack_") for name in names)
        deepstack = [extras[f"deepstack_{i}"] for i in range(depth)]
        visual = VisualRows(extras["visual_rows"], extras["visual_embeds"], deepstack)
    rope = (extras["rope_cos"], extras["rope_sin"], extras["rope_rows"]) if "rope_rows" in extras else None
    return ForwardBatch(
        input_ids=ids,
        positions=positions,
        attention=AttentionMetadata(
            query_start_loc=starts,
            seq_lens=seq_lens,
            block_tables=tables,
            slot_mapping=slots,
            visible_end=extras.get("visible_end"),
        ),
        logits_rows=arrays[count],
        state_slots=state_slots,
        is_pure_decode=bool(header["is_pure_decode"]),
        tokens_per_seq=int(header.get("tokens_per_seq", 0)),
        input_hidden=extras.get("input_hidden"),
        visual=visual,
        rope_rows=rope,
        host_inputs=(None, *host[1:]) if ids_from_rank_0(header) else host,
        state_checkpoints=extras.get("state_checkpoints"),
    )
