"""`RecurrentState` (per-layer state arrays by slot), `StateSnapshots` (the bounded snapshot pool) and the
block manager's side of hybrid prefix caching (`reusable`, `prefix_content`, `is_cached`)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.engine.block_manager import BlockManager, BlockTable
from atlas_core.engine.state_slots import StateSnapshots
from atlas_core.model.recurrent_state import RecurrentState, StateArraySpec


def two_layer_state(num_slots: int = 4) -> RecurrentState:
    state = RecurrentState()
    state.add_layer(0, conv=StateArraySpec((6, 3)), ssm=StateArraySpec((2, 4, 5), np.dtype(np.float32)))
    state.add_layer(2, conv=StateArraySpec((6, 3)))
    state.allocate(NumpyBackend(), num_slots)
    return state


def test_arrays_have_one_zeroed_row_per_slot() -> None:
    state = two_layer_state()
    assert state.arrays(0)["ssm"].shape == (4, 2, 4, 5) and state.arrays(2)["conv"].shape == (4, 6, 3)
    assert all(not array.any() for layer in (0, 2) for array in state.arrays(layer).values())
    assert state.bytes_per_slot(np.dtype(np.float32)) == (6 * 3 + 2 * 4 * 5 + 6 * 3) * 4


def test_reset_and_copy_touch_only_their_slots() -> None:
    state = two_layer_state()
    rng = np.random.default_rng(0)
    for layer in (0, 2):
        for array in state.arrays(layer).values():
            array[...] = rng.standard_normal(array.shape)
    before = {(layer, name): array.copy() for layer in (0, 2) for name, array in state.arrays(layer).items()}
    state.copy([1, 3], [3, 0])  # overlapping pairs: every source is read first
    state.reset(2)
    for (layer, name), old in before.items():
        now = state.arrays(layer)[name]
        np.testing.assert_array_equal(now[3], old[1])
        np.testing.assert_array_equal(now[0], old[3])
        np.testing.assert_array_equal(now[1], old[1])
        assert not now[2].any()


def test_misuse_is_refused() -> None:
    state = RecurrentState()
    state.add_layer(1, conv=StateArraySpec((2, 3)))
    with pytest.raises(ValueError, match="declared twice"):
        state.add_layer(1, conv=StateArraySpec((2, 3)))
    with pytest.raises(ValueError, match="no state arrays"):
        state.add_layer(2)
    with pytest.raises(RuntimeError, match="before allocate"):
        state.arrays(1)
    state.allocate(NumpyBackend(), 2)
    with pytest.raises(RuntimeError, match="after allocate"):
        state.add_layer(3, conv=StateArraySpec((2, 3)))
    with pytest.raises(ValueError, match="out of range"):
        state.reset(2)
    with pytest.raises(ValueError, match="out of range"):
        state.copy([0], [-1])


class FakeSlots:
    """Slot contents as plain values, to watch what `StateSnapshots` copies where."""

    def __init__(self) -> None:
        self.values: dict[int, object] = {}

    def copy(self, sources: list[int], destinations: list[int]) -> None:
        for src, dst in zip(sources, destinations, strict=True):
            self.values[dst] = self.values.get(src)


def test_snapshots_save_restore_and_evict_stale_before_lru() -> None:
    slots = FakeSlots()
    cached = {101, 102, 103}
    snapshots = StateSnapshots([10, 11], slots.copy, lambda block_hash, content: content in cached)
    slots.values[0], slots.values[1], slots.values[2] = "state A", "state B", "state C"
    snapshots.save(101, 9001, source_slot=0)
    snapshots.save(102, 9002, source_slot=1)
    snapshots.save(101, 9001, source_slot=2)  # already held: kept as it was, now most recently used
    assert len(snapshots) == 2 and 101 in snapshots and 102 in snapshots
    snapshots.restore(101, destination_slot=5)
    assert slots.values[5] == "state A"
    cached.discard(101)  # 101's prefix left the prefix cache: it goes first although 102 is older
    snapshots.save(103, 9003, source_slot=2)
    assert 101 not in snapshots and 102 in snapshots and 103 in snapshots
    snapshots.save(104, 9004, source_slot=0)  # nothing stale: the least recently used (102) goes
    assert 102 not in snapshots and 103 in snapshots and 104 in snapshots
    snapshots.discard(103)
    snapshots.discard(999)  # unknown: ignored
    assert len(snapshots) == 1
    with pytest.raises(KeyError):
        snapshots.restore(103, destination_slot=5)
    empty = StateSnapshots([], slots.copy, lambda h, c: True)
    empty.save(1, 2, source_slot=0)
    assert len(empty) == 0


def test_allocate_prompt_reuses_only_reusable_prefixes() -> None:
    manager = BlockManager(num_blocks=16, block_size=4)
    tokens = list(range(18))
    first = BlockTable()
    assert manager.allocate_prompt(first, tokens, use_cache=True) == 0
    manager.register_computed(first, tokens, len(tokens))
    contents = [manager.prefix_content(first, k) for k in range(1, 5)]
    assert all(c is not None for c in contents) and manager.prefix_content(first, 5) is None
    assert all(manager.is_cached(*c) for c in contents)  # type: ignore[misc]
    second_content = contents[1][1]  # type: ignore[index]
    second = BlockTable()
    assert manager.allocate_prompt(second, tokens, use_cache=True, reusable=lambda c: c == second_content) == 8
    third = BlockTable()
    assert manager.allocate_prompt(third, tokens, use_cache=True, reusable=lambda c: False) == 0
    fourth = BlockTable()
    assert manager.allocate_prompt(fourth, tokens, use_cache=True) == 16
    for table in (first, second, third, fourth):
        manager.free(table)
    manager.reset_prefix_cache()
    assert not manager.is_cached(*contents[0])  # type: ignore[misc]
    manager.check_invariants()
