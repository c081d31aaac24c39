"""Backend conformance: the paged KV cache (write_kv), paged attention, and the two chained the
way the attention layer calls them, against float64 oracles.

Fixtures, tolerances, the seed handling (``ATLAS_CONFORMANCE_SEED``) and the oracles shared with
other modules are in ``atlas_core.testing`` (``conformance``, ``oracles``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from atlas_core.backends.base import Array, AttentionMetadata
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.oracles import MAX_POSITIONS, oracle_rope, rope_tables


# ---- float64 oracles -----------------------------------------------------------------------------
def oracle_write_kv(cache: np.ndarray, new: np.ndarray, slots: np.ndarray) -> np.ndarray:
    block_size = cache.shape[1]
    out = cache.copy()
    for t, slot in enumerate(slots):
        if slot >= 0:
            out[slot // block_size, slot % block_size] = new[t]
    return out


def oracle_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> np.ndarray:
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = np.full(q.shape, np.nan)
    for b in range(meta.num_seqs):
        start, end, ctx = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1]), int(meta.seq_lens[b])
        table = meta.block_tables[b]
        for i, row in enumerate(range(start, end)):
            position = ctx - (end - start) + i
            first = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            last = position if meta.visible_end is None else int(meta.visible_end[row]) - 1
            keys = np.stack([k_cache[table[p // block_size], p % block_size] for p in range(first, last + 1)])
            values = np.stack([v_cache[table[p // block_size], p % block_size] for p in range(first, last + 1)])
            for head in range(q.shape[1]):
                kv_head = head // group
                scores = keys[:, kv_head] @ q[row, head] * scale
                weights = np.exp(scores - scores.max())
                out[row, head] = weights @ values[:, kv_head] / weights.sum()
    return out


# ---- paged KV cache ------------------------------------------------------------------------------
def skip_pattern(case: Case, tokens: int, pattern: str) -> np.ndarray:
    """Which tokens get slot -1: ``write``/``skip`` a lone token, or ``mixed`` (first token, one in
    the middle, and ~30% more are skipped; at least one is written)."""
    if pattern != "mixed":
        return np.full(tokens, pattern == "skip")
    skipped = case.rng.random(tokens) < 0.3
    skipped[[0, 2]], skipped[1] = True, False
    return skipped


@pytest.mark.parametrize(
    ("tokens", "kv_heads", "pattern"), [(1, 2, "write"), (1, 1, "skip"), (11, 2, "mixed"), (9, 1, "mixed")]
)
def test_write_kv(case: Case, tokens: int, kv_heads: int, pattern: str) -> None:
    num_blocks, block_size, head_dim = 6, 5, 8
    slots = case.rng.permutation(num_blocks * block_size)[:tokens]
    slots[skip_pattern(case, tokens, pattern)] = -1
    k_cache_dev, k_cache = case.upload(case.normal(num_blocks, block_size, kv_heads, head_dim))
    v_cache_dev, v_cache = case.upload(case.normal(num_blocks, block_size, kv_heads, head_dim))
    k_dev, k = case.upload(case.normal(tokens, kv_heads, head_dim))
    v_dev, v = case.upload(case.normal(tokens, kv_heads, head_dim))
    slots_dev, slots = case.upload(slots.astype(np.int32))
    with case.unchanged("write_kv", k=k_dev, v=v_dev, slot_mapping=slots_dev):
        result = case.backend.write_kv(k_cache_dev, v_cache_dev, k_dev, v_dev, slots_dev)
    assert result is None, f"write_kv works in place and returns None {case.tag}"
    for name, cache_dev, cache, new in (("k_cache", k_cache_dev, k_cache, k), ("v_cache", v_cache_dev, v_cache, v)):
        want = oracle_write_kv(cache, new, slots)
        case.assert_equal(case.host(cache_dev), want, f"write_kv {name} (slots {slots.tolist()}; -1 skips)")


def oracle_head_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    if weight is None:
        return x
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


@pytest.mark.parametrize(
    ("tokens", "q_heads", "kv_heads", "head_dim", "rotary_dim", "norms"),
    [
        (1, 4, 2, 16, 16, "qk"),
        (9, 6, 2, 16, 8, "none"),
        (7, 3, 3, 12, 8, "q"),
        (5, 4, 1, 40, 40, "qk"),
        (6, 4, 2, 128, 128, "qk"),
        (3, 2, 1, 64, 64, "none"),
        (150, 4, 2, 128, 128, "qk"),
    ],
    ids=[
        "decode_qk_norm",
        "prefill_partial_no_norm",
        "q_norm_only",
        "wide_heads_mixed_slots",
        "heads_of_128",
        "heads_of_64_no_norm",
        "prefill_heads_of_128",
    ],
)
def test_qk_norm_rope_write_kv(
    case: Case, tokens: int, q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int, norms: str
) -> None:
    """The fused attention-input op on strided q/k/v views of one QKV array, with slots of -1."""
    block_size, eps = 5, 1e-5
    num_blocks = max(8, -(-tokens // block_size))  # a slot for each token
    positions = case.rng.integers(0, MAX_POSITIONS, size=tokens)
    positions[0] = MAX_POSITIONS - 1
    slots = case.rng.permutation(num_blocks * block_size)[:tokens]
    slots[skip_pattern(case, tokens, "mixed" if tokens > 2 else "write")] = -1
    pos_dev, pos = case.upload(positions.astype(np.int32))
    slots_dev, slots = case.upload(slots.astype(np.int32))
    tables = rope_tables(case, rotary_dim)
    qkv_dev, qkv = case.upload(case.normal(tokens, (q_heads + 2 * kv_heads) * head_dim, scale=2.0))
    q_end, k_end = q_heads * head_dim, (q_heads + kv_heads) * head_dim
    views = [qkv_dev[:, :q_end], qkv_dev[:, q_end:k_end], qkv_dev[:, k_end:]]
    q_dev, k_dev, v_dev = (view.reshape(tokens, -1, head_dim) for view in views)
    q, k, v = (part.reshape(tokens, -1, head_dim) for part in (qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:]))
    weights = {
        name: case.upload(case.normal(head_dim) + 1.0, weight=True) if name in norms else (None, None) for name in "qk"
    }
    k_cache_dev, k_cache = case.upload(case.normal(num_blocks, block_size, kv_heads, head_dim))
    v_cache_dev, v_cache = case.upload(case.normal(num_blocks, block_size, kv_heads, head_dim))

    got = case.backend.qk_norm_rope_write_kv(
        q_dev,
        k_dev,
        v_dev,
        weights["q"][0],
        weights["k"][0],
        eps,
        pos_dev,
        tables.cos_dev,
        tables.sin_dev,
        k_cache_dev,
        v_cache_dev,
        slots_dev,
    )
    want_q = oracle_rope(oracle_head_norm(q, weights["q"][1], eps), pos, tables.cos, tables.sin)
    want_k = oracle_rope(oracle_head_norm(k, weights["k"][1], eps), pos, tables.cos, tables.sin)
    case.assert_close(got, want_q, f"qk_norm_rope_write_kv queries (norms: {norms or 'none'})")
    case.assert_close(
        k_cache_dev, oracle_write_kv(k_cache, want_k, slots), f"qk_norm_rope_write_kv k_cache (slots {slots.tolist()})"
    )
    case.assert_equal(case.host(v_cache_dev), oracle_write_kv(v_cache, v, slots), "qk_norm_rope_write_kv v_cache")


@dataclass
class PagedBatch:
    """A varlen batch over shuffled, non-contiguous blocks. The caches hold random values everywhere
    (unused blocks and the tails of last blocks included), standing in for earlier steps' keys."""

    meta: AttentionMetadata
    """On the backend (what the op reads)."""
    host_meta: AttentionMetadata
    """The same on the host (what the oracles read)."""
    positions: np.ndarray
    block_size: int
    k_cache_dev: Array
    v_cache_dev: Array
    k_cache: np.ndarray
    v_cache: np.ndarray
    scale: float

    def describe(self) -> str:
        return (
            f"block_size={self.block_size}, seq_lens={self.host_meta.seq_lens.tolist()}, "
            f"query_start_loc={self.host_meta.query_start_loc.tolist()}, "
            f"block_tables={self.host_meta.block_tables.tolist()}"
        )


def attention_lengths(case: Case, scenario: str, block_size: int) -> list[tuple[int, int]]:
    """``(cached, new)`` tokens per sequence. ``mixed``: a decode token with a long context, a prefill
    chunk continuing a context and a fresh prompt, in random order, none ending on a block boundary."""

    def draw(low: int, high: int) -> int:
        return int(case.rng.integers(low, high))

    if scenario == "mixed":
        lengths = [(draw(30, 60), 1), (draw(7, 20), draw(4, 9)), (0, draw(5, 13))]
        lengths = [(cached + ((cached + new) % block_size == 0), new) for cached, new in lengths]
        return [lengths[i] for i in case.rng.permutation(len(lengths))]
    if scenario == "decode_t1":
        return [(draw(1, 40), 1)]
    if scenario == "decode_batch":  # a first token, and a context ending exactly on a block boundary
        return [(0, 1), (draw(1, 30), 1), (3 * block_size - 1, 1), (draw(20, 50), 1)]
    if scenario == "prefill":
        return [(0, draw(9, 17)), (0, 1)]
    if scenario == "images_long":  # contexts over one split of keys, a decode token beside them
        return [(draw(60, 90), draw(30, 50)), (draw(5, 20), 1), (0, draw(10, 20))]
    if scenario == "images_short":
        return [(draw(3, 10), draw(10, 20))]
    raise ValueError(scenario)


def paged_batch(case: Case, scenario: str, kv_heads: int, head_dim: int) -> PagedBatch:
    block_size = int(case.rng.choice([3, 5, 7]))
    lengths = attention_lengths(case, scenario, block_size)
    seq_lens = [cached + new for cached, new in lengths]
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3
    pool = case.rng.permutation(num_blocks)
    tables = np.full((len(lengths), max(needed) + 1), -1, dtype=np.int32)
    slots, positions, starts = [], [], [0]
    for b, (cached, new) in enumerate(lengths):
        tables[b, : needed[b]] = pool[sum(needed[:b]) : sum(needed[: b + 1])]
        positions.extend(range(cached, cached + new))
        slots.extend(tables[b, p // block_size] * block_size + p % block_size for p in range(cached, cached + new))
        starts.append(starts[-1] + new)
    host_meta = AttentionMetadata(
        query_start_loc=np.asarray(starts, dtype=np.int32),
        seq_lens=np.asarray(seq_lens, dtype=np.int32),
        block_tables=tables,
        slot_mapping=np.asarray(slots, dtype=np.int32),
    )
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache_dev, k_cache = case.upload(case.normal(*cache_shape))
    v_cache_dev, v_cache = case.upload(case.normal(*cache_shape))
    scale = float(case.rng.uniform(0.7, 1.5)) * head_dim**-0.5
    return PagedBatch(
        upload_meta(case, host_meta),
        host_meta,
        np.asarray(positions),
        block_size,
        k_cache_dev,
        v_cache_dev,
        k_cache,
        v_cache,
        scale,
    )


def upload_meta(case: Case, host_meta: AttentionMetadata) -> AttentionMetadata:
    return AttentionMetadata(
        *(
            case.backend.from_numpy(getattr(host_meta, name))
            for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping")
        ),
        visible_end=None if host_meta.visible_end is None else case.backend.from_numpy(host_meta.visible_end),
    )


def image_spans(case: Case, batch: PagedBatch) -> None:
    """Give the batch's prefill rows bidirectional spans (`AttentionMetadata.visible_end`): one or two
    random runs of each sequence's new tokens (more than one token, the last one at the chunk's end or
    before it) see up to their run's end; every other row stays causal."""
    meta = batch.host_meta
    limits = batch.positions.astype(np.int32) + 1
    for b in range(meta.num_seqs):
        start, end = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1])
        cut = start
        while end - cut >= 3:
            first = int(case.rng.integers(cut, end - 2))
            stop = int(case.rng.integers(first + 2, min(end, first + 20) + 1))
            limits[first:stop] = limits[stop - 1]
            cut = stop + 1
    meta.visible_end = limits
    batch.meta = upload_meta(case, meta)


@pytest.mark.parametrize("group", [1, 2, 4], ids=["mha", "gqa2", "gqa4"])
@pytest.mark.parametrize("scenario", ["mixed", "decode_t1", "decode_batch", "prefill"])
def test_attention(case: Case, scenario: str, group: int) -> None:
    backend, kv_heads, head_dim = case.backend, 2, 16
    batch = paged_batch(case, scenario, kv_heads, head_dim)
    q_dev, q = case.upload(case.normal(len(batch.positions), kv_heads * group, head_dim, scale=1.5))
    want = oracle_attention(q, batch.k_cache, batch.v_cache, batch.host_meta, batch.scale)
    with case.unchanged("attention", q=q_dev, k_cache=batch.k_cache_dev, v_cache=batch.v_cache_dev):
        case.check_out_variants(
            lambda out: backend.attention(
                q_dev, batch.k_cache_dev, batch.v_cache_dev, batch.meta, batch.scale, out=out
            ),
            want,
            f"attention ({scenario}, {batch.describe()})",
        )


def hide_blocks_outside_window(case: Case, batch: PagedBatch, window: int) -> None:
    """Blocks wholly before every query's window get NaN keys and values on the device, and every
    second one is dropped from the block table (-1), as a block manager that frees them would."""
    k_cache, v_cache = case.host(batch.k_cache_dev), case.host(batch.v_cache_dev)
    meta = batch.host_meta
    for b in range(meta.num_seqs):
        q_len = int(meta.query_start_loc[b + 1] - meta.query_start_loc[b])
        first_visible = max(0, int(meta.seq_lens[b]) - q_len - window + 1)
        for index in range(first_visible // batch.block_size):
            block = meta.block_tables[b, index]
            k_cache[block], v_cache[block] = np.nan, np.nan
            if index % 2:
                meta.block_tables[b, index] = -1
    batch.k_cache_dev, batch.v_cache_dev = case.upload(k_cache)[0], case.upload(v_cache)[0]
    batch.meta = upload_meta(case, meta)


@pytest.mark.parametrize("window", [1, 4, 9])
@pytest.mark.parametrize("scenario", ["mixed", "decode_batch", "prefill"])
def test_attention_sliding_window(case: Case, scenario: str, window: int) -> None:
    backend, kv_heads, head_dim, group = case.backend, 2, 16, 2
    batch = paged_batch(case, scenario, kv_heads, head_dim)
    q_dev, q = case.upload(case.normal(len(batch.positions), kv_heads * group, head_dim, scale=1.5))
    want = oracle_attention(q, batch.k_cache, batch.v_cache, batch.host_meta, batch.scale, sliding_window=window)
    hide_blocks_outside_window(case, batch, window)
    case.check_out_variants(
        lambda out: backend.attention(
            q_dev, batch.k_cache_dev, batch.v_cache_dev, batch.meta, batch.scale, out=out, sliding_window=window
        ),
        want,
        f"attention with sliding_window={window} ({scenario}, {batch.describe()}; blocks before the window are NaN)",
    )


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window6"])
@pytest.mark.parametrize("scenario", ["images_long", "images_short"])
def test_attention_bidirectional_image_spans(case: Case, scenario: str, window: int | None) -> None:
    """Rows of an image that attends to itself (Gemma 3 / 4) see the image's later keys too; a sliding
    window still counts back from each row's own position."""
    backend, kv_heads, head_dim, group = case.backend, 2, 16, 2
    batch = paged_batch(case, scenario, kv_heads, head_dim)
    image_spans(case, batch)
    assert batch.host_meta.visible_end is not None
    assert (batch.host_meta.visible_end > batch.positions + 1).any()
    q_dev, q = case.upload(case.normal(len(batch.positions), kv_heads * group, head_dim, scale=1.5))
    want = oracle_attention(q, batch.k_cache, batch.v_cache, batch.host_meta, batch.scale, sliding_window=window)
    case.check_out_variants(
        lambda out: backend.attention(
            q_dev, batch.k_cache_dev, batch.v_cache_dev, batch.meta, batch.scale, out=out, sliding_window=window
        ),
        want,
        f"attention with visible_end={batch.host_meta.visible_end.tolist()} window={window} ({batch.describe()})",
    )


@pytest.mark.parametrize("group", [1, 2, 4], ids=["mha", "gqa2", "gqa4"])
def test_attention_layer_pipeline(case: Case, group: int) -> None:
    """As the attention layer calls the ops: q/k/v are strided views of one fused QKV array, RoPE
    (partial) rotates q and k in place, write_kv stores this step's k/v, attention reads them back."""
    kv_heads, head_dim, rotary_dim = 2, 12, 8
    q_heads = kv_heads * group
    batch = paged_batch(case, "mixed", kv_heads, head_dim)
    tokens = len(batch.positions)
    qkv_dev, qkv = case.upload(case.normal(tokens, (q_heads + 2 * kv_heads) * head_dim))
    q_end, k_end = q_heads * head_dim, (q_heads + kv_heads) * head_dim
    views = {
        "q": qkv_dev[:, :q_end].reshape(tokens, q_heads, head_dim),
        "k": qkv_dev[:, q_end:k_end].reshape(tokens, kv_heads, head_dim),
        "v": qkv_dev[:, k_end:].reshape(tokens, kv_heads, head_dim),
    }
    tables = rope_tables(case, rotary_dim)
    positions_dev, positions = case.upload(batch.positions.astype(np.int32))
    slots_dev, slots = case.upload(batch.host_meta.slot_mapping)
    want = {
        "q": oracle_rope(qkv[:, :q_end].reshape(tokens, q_heads, head_dim), positions, tables.cos, tables.sin),
        "k": oracle_rope(qkv[:, q_end:k_end].reshape(tokens, kv_heads, head_dim), positions, tables.cos, tables.sin),
    }
    k_cache = oracle_write_kv(batch.k_cache, want["k"], slots)
    v_cache = oracle_write_kv(batch.v_cache, qkv[:, k_end:].reshape(tokens, kv_heads, head_dim), slots)

    case.backend.rope(views["q"], views["k"], positions_dev, tables.cos_dev, tables.sin_dev)
    case.assert_close(views["q"], want["q"], "rope on a strided q view")
    case.assert_close(views["k"], want["k"], "rope on a strided k view")
    case.assert_equal(case.host(qkv_dev)[:, k_end:], qkv[:, k_end:], "rope must not touch the v columns")
    case.backend.write_kv(batch.k_cache_dev, batch.v_cache_dev, views["k"], views["v"], slots_dev)
    case.assert_close(batch.k_cache_dev, k_cache, "write_kv from a strided k view")
    case.assert_close(batch.v_cache_dev, v_cache, "write_kv from a strided v view")
    got = case.backend.attention(views["q"], batch.k_cache_dev, batch.v_cache_dev, batch.meta, batch.scale)
    want_mixed = oracle_attention(want["q"], k_cache, v_cache, batch.host_meta, batch.scale)
    case.assert_close(got, want_mixed, f"attention on a strided q view ({batch.describe()})")
