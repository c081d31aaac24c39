"""Paged KV cache storage and its sizing from a memory budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.kv_dtypes import KV_DTYPES, dtype_label, is_scaled
from atlas_core.backends.transfers import gather_rows, scatter_rows
from atlas_core.errors import AtlasError, ConfigError


@dataclass(frozen=True)
class KVLayout:
    """One attention layer's KV: ``num_kv_heads`` heads of ``head_dim`` values for K and for V,
    stored in ``dtype`` (None: the backend's activation dtype; `atlas_core.backends.kv_dtypes` lists the others).

    The cache holds a key and a value array per layer, each ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    ``k_scale`` / ``v_scale``: the float32 scales of fp8 storage (stored = x / scale; the checkpoint's
    ``k_scale`` / ``v_scale`` where it has them); unused by other dtypes.
    """

    num_kv_heads: int
    head_dim: int
    dtype: np.dtype | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def token_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Per-token shape of each array of the layer: key, then value."""
        return (self.num_kv_heads, self.head_dim), (self.num_kv_heads, self.head_dim)

    def describe(self) -> str:
        return f"K/V {self.num_kv_heads}x{self.head_dim}"

    def bytes_per_token(self, default_dtype: np.dtype) -> int:
        return _bytes_per_token(self.token_shapes, self.dtype or default_dtype)


@dataclass(frozen=True)
class LatentKVLayout:
    """A multi-head latent attention (MLA) layer's KV: per token, the compressed latent
    (``latent_dim`` values, already normed) followed by the rotated shared key part (``rope_dim``
    values), in ``dtype`` (None: the backend's activation dtype).

    The cache holds one array per layer, ``[num_blocks, block_size, 1, latent_dim + rope_dim]``, in
    `KVCache.keys`; the layer has no value array (`KVCache.values` holds None for it): the values
    are the latent part of the same rows.
    """

    latent_dim: int
    rope_dim: int
    dtype: np.dtype | None = None

    @property
    def token_shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((1, self.latent_dim + self.rope_dim),)

    def describe(self) -> str:
        return f"MLA latent {self.latent_dim}+{self.rope_dim}"

    def bytes_per_token(self, default_dtype: np.dtype) -> int:
        return _bytes_per_token(self.token_shapes, self.dtype or default_dtype)


AnyKVLayout = KVLayout | LatentKVLayout
"""The KV layout of one attention layer, as listed in ``TransformerModel.kv_layouts``."""


def _bytes_per_token(token_shapes: tuple[tuple[int, ...], ...], dtype: np.dtype) -> int:
    return sum(int(np.prod(shape)) for shape in token_shapes) * np.dtype(dtype).itemsize


def describe_layouts(layouts: list[AnyKVLayout]) -> str:
    """``"4 layers"``, or with several kinds of layer ``"4 layers: 2 x K/V 2x16, 2 x MLA latent 32+8"``."""
    counts: dict[str, int] = {}
    for layout in layouts:
        counts[layout.describe()] = counts.get(layout.describe(), 0) + 1
    if len(counts) <= 1 and all(isinstance(layout, KVLayout) for layout in layouts):
        return f"{len(layouts)} layers"
    return f"{len(layouts)} layers: " + ", ".join(f"{n} x {kind}" for kind, n in counts.items())


def kv_storage_layouts(
    layouts: list[AnyKVLayout], kv_cache_dtype: str, backend: Backend, high_precision: str | Sequence[str | int] = ()
) -> list[AnyKVLayout]:
    """``layouts`` (a model's) with the storage dtype the ``kv_cache_dtype`` setting asks for.

    ``auto``, and a name whose dtype is the backend's activation dtype, change nothing. Otherwise the
    backend must list the name in `Backend.kv_cache_dtypes`, and no layer may be an MLA latent layer
    (`LatentKVLayout`, which stays in the activation dtype): else `ConfigError` naming what is supported.
    ``high_precision`` (the ``kv_high_precision_layers`` setting, `high_precision_layers`): indices into
    ``layouts`` (the model's KV layers in order, from 0; MTP layers after them) that keep the activation dtype;
    `ConfigError` for an index out of range, or when the setting asks for no narrower dtype."""
    keep = high_precision_layers(high_precision, len(layouts))
    if kv_cache_dtype == "auto" or KV_DTYPES[kv_cache_dtype] == np.dtype(backend.activation_dtype):
        if keep:
            raise ConfigError(
                f"kv_high_precision_layers applies to a KV cache narrower than the activations "
                f"(kv_cache_dtype=fp8), not to kv_cache_dtype={kv_cache_dtype}; drop it or set kv_cache_dtype=fp8"
            )
        return list(layouts)
    if kv_cache_dtype not in backend.kv_cache_dtypes:
        own = {name for name, dtype in KV_DTYPES.items() if dtype == np.dtype(backend.activation_dtype)}
        raise ConfigError(
            f"kv_cache_dtype={kv_cache_dtype} is not supported by the {backend.name!r} backend; it supports: "
            + ", ".join(["auto", *sorted(own | backend.kv_cache_dtypes)])
        )
    if any(isinstance(layout, LatentKVLayout) for layout in layouts):
        raise ConfigError(
            f"kv_cache_dtype={kv_cache_dtype} is not supported for MLA latent KV caches (the latent rows stay in the "
            f"activation dtype, {dtype_label(backend.activation_dtype)}); use kv_cache_dtype=auto"
        )
    return [
        layout if i in keep else dataclasses.replace(layout, dtype=KV_DTYPES[kv_cache_dtype])
        for i, layout in enumerate(layouts)
    ]


def with_kv_scales(layouts: list[AnyKVLayout], scales: Sequence[Sequence[float]]) -> list[AnyKVLayout]:
    """``layouts`` with ``scales[i]`` as layer i's ``(k_scale, v_scale)`` where it is a `KVLayout` (others keep
    theirs); one pair per layout."""
    if len(scales) != len(layouts):
        raise ValueError(f"{len(scales)} KV scale pairs for {len(layouts)} layers")
    return [
        dataclasses.replace(layout, k_scale=float(pair[0]), v_scale=float(pair[1]))
        if isinstance(layout, KVLayout)
        else layout
        for layout, pair in zip(layouts, scales, strict=True)
    ]


def layout_scales(layouts: list[AnyKVLayout]) -> list[tuple[float, float]]:
    """Every layer's ``(k_scale, v_scale)`` (``(1.0, 1.0)`` for layers without)."""
    return [(layout.k_scale, layout.v_scale) if isinstance(layout, KVLayout) else (1.0, 1.0) for layout in layouts]


def high_precision_layers(values: str | Sequence[str | int], count: int) -> set[int]:
    """The KV layer indices ``values`` names (whole numbers from 0 to ``count - 1``, as numbers or as text, each item
    possibly a comma-separated list such as ``"0,47"``); `ConfigError` otherwise."""
    items = [values] if isinstance(values, str) else list(values)
    keep = set()
    for text in (part.strip() for item in items for part in str(item).split(",") if part.strip()):
        if not text.isdigit() or int(text) >= count:
            raise ConfigError(
                f"kv_high_precision_layers: {text!r} is not a KV layer of this model; give indices from 0 to "
                f"{count - 1} (its {count} KV layers in order)"
            )
        keep.add(int(text))
    return keep


class KVCacheTooSmallError(AtlasError):
    """The memory budget cannot hold what was asked; the message gives the numbers and what fits."""


@dataclass(frozen=True)
class KVPlan:
    """How many blocks the budget holds, and the figures behind it (for messages and the ready line)."""

    num_blocks: int
    block_size: int
    bytes_per_token: int

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


def plan_kv_cache(
    layouts: list[AnyKVLayout],
    default_dtype: np.dtype,
    block_size: int,
    budget_bytes: int,
    max_seq_len: int,
    budget_source: str,
    max_num_seqs: int = 1,
    more: Callable[[int], str | None] | None = None,
) -> KVPlan:
    """Blocks that fit in ``budget_bytes``; `KVCacheTooSmallError` if not one ``max_seq_len`` sequence.

    ``budget_source`` says where the budget came from and which setting changes it; ``more(extra)``, when
    given, names the setting that gives ``extra`` bytes more (``name=value``; None when none can), which the
    error then proposes. ``budget_bytes`` may be negative (the memory in use or the recurrent state took it
    all). A model without attention layers (no ``layouts``: a recurrent stack) caches nothing; its blocks only
    count tokens, ``max_num_seqs`` sequences of ``max_seq_len`` of them.
    """
    bytes_per_token = sum(layout.bytes_per_token(default_dtype) for layout in layouts)
    stored_as = "/".join(sorted({dtype_label(layout.dtype or default_dtype) for layout in layouts}))
    bytes_per_block = bytes_per_token * block_size
    needed = -(-max_seq_len // block_size)
    if bytes_per_block == 0:
        return KVPlan(needed * max_num_seqs, block_size, 0)
    num_blocks = max(0, budget_bytes) // bytes_per_block
    if num_blocks < needed:
        mib, wanted = 2**20, needed * bytes_per_block
        short = wanted - budget_bytes
        gives = (
            f"{budget_bytes / mib:.1f} MiB"
            if budget_bytes >= 0
            else f"nothing ({-budget_bytes / mib:.1f} MiB below zero)"
        )
        fixes = [f"Lower max_seq_len to at most {num_blocks * block_size}"] if num_blocks else []
        setting = more(short) if more is not None else None
        if setting is not None:
            fixes.append(f"set {setting}")
        elif more is not None:
            fixes.append(
                f"make {short / mib:.1f} MiB more room for it (more than the budget's setting can give on this "
                "device: free device memory first)"
            )
        else:
            fixes.append(f"give the KV cache {short / mib:.1f} MiB more")
        remedy = ", or ".join(fixes)
        raise KVCacheTooSmallError(
            f"the KV cache cannot hold one sequence of max_seq_len={max_seq_len}: {budget_source} gives {gives}, "
            f"which holds {num_blocks} blocks of {block_size} tokens ({bytes_per_token} bytes per token over "
            f"{describe_layouts(layouts)}) with KV stored as {stored_as}, but one sequence needs {needed} blocks "
            f"({wanted / mib:.1f} MiB). {remedy[0].upper()}{remedy[1:]}."
        )
    return KVPlan(int(num_blocks), block_size, bytes_per_token)


class KVCache:
    """Per-layer cache arrays on the backend, ``[num_blocks, block_size, *token_shape]`` each.

    ``keys[i]`` / ``values[i]``: layer i's key and value arrays (`KVLayout`:
    ``[num_blocks, block_size, num_kv_heads, head_dim]``); for a `LatentKVLayout` layer ``keys[i]``
    is the latent array and ``values[i]`` is None. ``scales[i]``: ``(k_scale, v_scale)`` of a layer
    stored scaled (fp8: `Backend.write_kv_scaled` / `Backend.attention_scaled`), else None.
    """

    def __init__(self, backend: Backend, layouts: list[AnyKVLayout], plan: KVPlan) -> None:
        self.backend = backend
        self.block_size = plan.block_size
        self.num_blocks = plan.num_blocks
        self.keys: list[Array] = []
        self.values: list[Array | None] = []
        self.scales: list[tuple[float, float] | None] = []
        for layout in layouts:
            dtype = layout.dtype or backend.activation_dtype
            scaled = isinstance(layout, KVLayout) and is_scaled(dtype)
            self.scales.append((layout.k_scale, layout.v_scale) if scaled and isinstance(layout, KVLayout) else None)
            arrays = [backend.zeros((plan.num_blocks, plan.block_size, *shape), dtype) for shape in layout.token_shapes]
            self.keys.append(arrays[0])
            self.values.append(arrays[1] if len(arrays) > 1 else None)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write of shared blocks)."""
        src = np.asarray([s for s, _ in copies])
        dst = np.asarray([d for _, d in copies])
        for cache in (*self.keys, *self.values):
            if cache is not None:
                cache[dst] = cache[src]

    @property
    def arrays(self) -> list[Array]:
        """Every cache array: the keys of each layer, then the values of each layer that has them."""
        return [cache for cache in (*self.keys, *self.values) if cache is not None]

    def block_shapes(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        """``(shape, dtype)`` of one block of each of `arrays` (what `read_blocks` returns per block)."""
        return [(tuple(cache.shape[1:]), np.dtype(cache.dtype)) for cache in self.arrays]

    def read_blocks(self, blocks: list[int]) -> list[np.ndarray]:
        """Host copies of ``blocks``: one array per entry of `arrays`, ``[len(blocks), *block shape]``, bit-exact."""
        return gather_rows(self.backend, self.arrays, blocks)

    def write_blocks(self, blocks: list[int], arrays: list[np.ndarray]) -> None:
        """Store host arrays (as `read_blocks` returns them) into ``blocks``, bit-exact."""
        scatter_rows(self.backend, self.arrays, blocks, arrays)


def slot_of(blocks: list[int], block_size: int, position: int) -> int:
    """The flat KV slot of token position ``position`` of a sequence owning ``blocks``."""
    return blocks[position // block_size] * block_size + position % block_size


def slots_for(blocks: list[int], block_size: int, start: int, end: int) -> np.ndarray:
    """Flat KV slots (int64) of token positions ``start..end-1`` of a sequence owning ``blocks``."""
    if end - start == 1:  # a decode token: no array arithmetic (0.4 instead of 2.4 us of host time a sequence)
        return np.array([slot_of(blocks, block_size, start)], dtype=np.int64)
    positions = np.arange(start, end)
    return np.asarray(blocks, dtype=np.int64)[positions // block_size] * block_size + positions % block_size
