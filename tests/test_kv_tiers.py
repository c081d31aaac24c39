"""Storage tiers: host-memory records round-trip bit-exact, `TieredStore` demotes least recently used
records and never evicts pinned ones, a failing tier is left out with one warning, and the KV cache and
recurrent state read and write blocks / slots bit-exact."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.batch.kv_cache import KVCache, KVLayout, KVPlan, LatentKVLayout
from atlas_core.model.recurrent_state import RecurrentState, StateArraySpec
from atlas_core.storage import RecordFormat, StorageBackend, StorageFullError, TierSpec
from atlas_core.storage.host import HostMemoryStorage
from atlas_core.storage.tiered import TieredStore
from atlas_core.testing.storage import random_records

FORMAT = RecordFormat(
    (((4, 2, 8), np.dtype(np.float32)), ((4, 3), np.dtype(ml_dtypes.bfloat16)), ((5,), np.dtype(np.uint8)))
)


def records(count: int, seed: int = 0) -> list[np.ndarray]:
    return random_records(FORMAT, count, seed)


def host(slots: int) -> HostMemoryStorage:
    return HostMemoryStorage(TierSpec(FORMAT, slots * FORMAT.nbytes))


def assert_bits_equal(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> None:
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert a.tobytes() == e.tobytes()


def test_host_tier_round_trip_is_bit_exact() -> None:
    tier = host(8)
    assert tier.capacity_slots == 8
    data = records(3)
    tier.write([5, 0, 7], [1, 2, None], data)
    out = FORMAT.empty(3)
    assert tier.read([5, 0, 7], out) == []
    assert_bits_equal(out, data)
    assert tier.read([1], FORMAT.empty(1)) == [1]  # never written: lost, not garbage
    tier.discard([0])
    assert tier.read([0, 5], FORMAT.empty(2)) == [0]


def test_records_read_into_rows_in_order_or_scattered() -> None:
    """`RecordFormat.read_rows`: rows 0 .. n-1 are read straight into the arrays, other rows through staging;
    failed slots are reported and leave the other rows intact."""
    tier = host(6)
    data = records(4)
    tier.write([3, 1, 4, 0], [None] * 4, data)
    direct = FORMAT.empty(4)
    assert FORMAT.read_rows(tier.read, [3, 1, 4, 0], [0, 1, 2, 3], direct) == set()
    assert_bits_equal(direct, data)
    scattered = FORMAT.empty(5)
    assert FORMAT.read_rows(tier.read, [0, 5, 3], [4, 2, 0], scattered) == {5}  # slot 5 was never written
    assert_bits_equal([a[[4, 0]] for a in scattered], [a[[3, 0]] for a in data])


def test_tiered_store_demotes_lru_and_keeps_pinned() -> None:
    store = TieredStore(FORMAT, [("fast", host(2)), ("slow", host(2))])
    data = records(5)
    assert store.put(["a", "b"], [a[:2] for a in data], pinned=False) == ["a", "b"]
    out = FORMAT.empty(1)
    assert store.get(["a"], out) == []  # "a" is now the most recently used
    assert store.put(["p"], [a[2:3] for a in data], pinned=True) == ["p"]
    assert (store.tier_of("p"), store.tier_of("a"), store.tier_of("b")) == ("fast", "fast", "slow")
    assert store.put(["c", "d"], [a[3:5] for a in data], pinned=False) == ["c", "d"]
    # "a" went down, "b" fell out of the last tier; the pinned record stayed
    assert "b" not in store and store.tier_of("p") == "fast" and store.tier_of("a") == "slow"
    out = FORMAT.empty(4)
    assert store.get(["a", "p", "c", "d"], out) == []
    assert_bits_equal(out, [np.concatenate([a[0:1], a[2:5]]) for a in data])
    assert store.get(["b", "zz"], FORMAT.empty(2)) == ["b", "zz"]
    store.drop(["a", "p", "c", "d"])
    assert len(store) == 0 and store.num_pinned == 0 and store.room() == 4


def test_pinned_records_are_never_evicted() -> None:
    store = TieredStore(FORMAT, [("fast", host(2))])
    data = records(3)
    assert store.put(["x", "y"], [a[:2] for a in data], pinned=True) == ["x", "y"]
    assert store.room() == 0
    assert store.put(["z"], [a[2:] for a in data], pinned=False) == []
    assert store.put(["z"], [a[2:] for a in data], pinned=True) == []


class FullDisk(StorageBackend):
    """A tier whose every write fails as a full disk does."""

    @property
    def capacity_slots(self) -> int:
        return 4

    def write(self, slots: Sequence[int], keys: Sequence[int | None], arrays: Sequence[np.ndarray]) -> None:
        raise StorageFullError("No space left on device")

    def read(self, slots: Sequence[int], out: Sequence[np.ndarray]) -> list[int]:
        return list(slots)


def test_failing_tier_is_left_out_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    store = TieredStore(FORMAT, [("disk", FullDisk()), ("spare", host(1))])
    data = records(2)
    with caplog.at_level(logging.WARNING, logger="atlas.storage"):
        assert store.put(["a"], [a[:1] for a in data], pinned=False) == []
        assert store.put(["b"], [a[1:] for a in data], pinned=False) == ["b"]
    assert store.tier_of("b") == "spare"
    assert len([r for r in caplog.records if "cannot store" in r.message]) == 1


def test_kv_cache_blocks_round_trip_bit_exact() -> None:
    backend = NumpyBackend()
    layouts = [KVLayout(2, 8), LatentKVLayout(6, 2), KVLayout(1, 4, np.dtype(np.uint8))]
    kv = KVCache(backend, layouts, KVPlan(num_blocks=6, block_size=4, bytes_per_token=0))
    rng = np.random.default_rng(1)
    for cache in kv.arrays:
        cache[...] = rng.integers(0, 255, cache.shape).astype(cache.dtype)
    saved = kv.read_blocks([3, 1])
    assert [a.shape[1:] for a in saved] == [shape for shape, _ in kv.block_shapes()]
    kv.write_blocks([0, 5], saved)
    assert_bits_equal(kv.read_blocks([0, 5]), saved)
    assert_bits_equal(kv.read_blocks([0, 5]), kv.read_blocks([3, 1]))


def test_recurrent_state_slots_round_trip_bit_exact() -> None:
    state = RecurrentState()
    state.add_layer(0, conv=StateArraySpec((3, 2)), ssm=StateArraySpec((2, 2, 2), np.dtype(np.float32)))
    state.allocate(NumpyBackend(), 3)
    for array in state.arrays(0).values():
        array[...] = np.random.default_rng(2).standard_normal(array.shape)
    saved = state.read_slots([1])
    state.reset(1)
    state.write_slots([2], saved)
    assert_bits_equal(state.read_slots([2]), saved)
    with pytest.raises(ValueError, match="out of range"):
        state.write_slots([3], saved)
