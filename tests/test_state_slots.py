"""`StateSlotPool`: exclusive slots, the reset callback, exhaustion and misuse."""

from __future__ import annotations

import pytest

from atlas_core.engine.state_slots import StateSlotPool


def test_allocates_distinct_slots_and_resets_each() -> None:
    resets: list[int] = []
    pool = StateSlotPool(3, reset=resets.append)
    slots = [pool.allocate() for _ in range(3)]
    assert sorted(slots) == [0, 1, 2]  # type: ignore[type-var]
    assert resets == slots
    assert pool.num_free == 0
    assert pool.allocate() is None
    assert resets == slots  # no reset for a failed allocation


def test_freed_slot_is_reused_and_reset_again() -> None:
    resets: list[int] = []
    pool = StateSlotPool(2, reset=resets.append)
    first = pool.allocate()
    second = pool.allocate()
    assert first is not None and second is not None
    pool.free(first)
    assert pool.num_free == 1
    assert pool.allocate() == first
    assert resets == [first, second, first]


def test_double_free_and_unknown_slot_raise() -> None:
    pool = StateSlotPool(2)
    slot = pool.allocate()
    assert slot is not None
    pool.free(slot)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(slot)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(1)  # never allocated
    for bad in (-1, 2):
        with pytest.raises(ValueError, match="unknown"):
            pool.free(bad)
    assert pool.num_free == 2


def test_failing_reset_leaves_the_slot_free() -> None:
    def reset(slot: int) -> None:
        raise RuntimeError("device error")

    pool = StateSlotPool(1, reset=reset)
    with pytest.raises(RuntimeError):
        pool.allocate()
    assert pool.num_free == 1


def test_no_leaks_after_churn() -> None:
    pool = StateSlotPool(4)
    held: list[int] = []
    for step in range(50):
        if step % 3 == 2 and held:
            pool.free(held.pop(0))
        else:
            slot = pool.allocate()
            if slot is None:
                assert len(held) == 4
            else:
                assert slot not in held
                held.append(slot)
    for slot in held:
        pool.free(slot)
    assert pool.num_free == pool.num_slots == 4


def test_empty_pool_and_bad_size() -> None:
    assert StateSlotPool(0).allocate() is None
    with pytest.raises(ValueError):
        StateSlotPool(-1)
