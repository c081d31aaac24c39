"""`RecurrentState`: the per-layer state arrays of recurrent layers (gated delta nets, Mamba-2), one row
per state slot.

Recurrent layers keep a fixed-size state per sequence instead of (or beside) a growing KV cache: a
short causal-convolution window and an SSM / delta-rule matrix. Those states live here, in one
backend array per (layer, name) of shape ``[num_slots, *per_slot_shape]``. Row ``s`` belongs to
whichever sequence the engine gave state slot ``s`` (`atlas_core.engine.state_slots.StateSlotPool`),
and ``ForwardBatch.state_slots[b]`` says which row sequence ``b`` of a batch uses.

How a family loader uses it::

    state = RecurrentState()
    for i in recurrent_layer_indices:
        state.add_layer(i, conv=StateArraySpec((conv_dim, kernel - 1)),
                        ssm=StateArraySpec((heads, k_dim, v_dim), np.dtype(np.float32)))
        mixer = MyRecurrentMixer(backend, ..., layer_index=i, state=state)
    model = TransformerModel(..., recurrent_state=state)

The engine then calls ``model.allocate_state(num_slots)`` once, before the first forward; each mixer
reads its arrays at call time with ``state.arrays(layer_index)["conv"]`` (never before allocation)
and reads / updates the rows of ``batch.state_slots`` in place. A freshly allocated slot is all
zeros (``reset``), which is the state before a sequence's first token. ``copy`` duplicates rows,
used for n > 1 completions (forks) and for prefix-cache state snapshots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.transfers import gather_rows, scatter_rows


@dataclass(frozen=True)
class StateArraySpec:
    """One named state array of one layer: the shape of one slot's row, and its dtype (None: the
    backend's activation dtype)."""

    shape: tuple[int, ...]
    dtype: np.dtype | None = None

    def nbytes(self, default_dtype: np.dtype) -> int:
        """Bytes of one slot's row."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype or default_dtype).itemsize


class RecurrentState:
    """Every recurrent layer's state arrays, ``[num_slots, *shape]`` each, on one backend.

    Declare layers with `add_layer` (at load), size once with `allocate`, then `arrays`, `reset` and
    `copy` by slot. Not thread-safe; the engine thread owns it.
    """

    def __init__(self) -> None:
        self.specs: dict[int, dict[str, StateArraySpec]] = {}
        self.num_slots = 0
        self._arrays: dict[int, dict[str, Array]] | None = None
        self._backend: Backend | None = None

    def add_layer(self, layer_index: int, **arrays: StateArraySpec) -> None:
        """Declare the named state arrays of layer ``layer_index`` (before `allocate`)."""
        if self._arrays is not None:
            raise RuntimeError("RecurrentState.add_layer called after allocate()")
        if layer_index in self.specs:
            raise ValueError(f"recurrent state of layer {layer_index} is declared twice")
        if not arrays:
            raise ValueError(f"layer {layer_index} declares no state arrays")
        self.specs[layer_index] = dict(arrays)

    def bytes_per_slot(self, default_dtype: np.dtype) -> int:
        """Bytes one slot takes over every layer (``default_dtype``: the backend's activation dtype)."""
        return sum(spec.nbytes(default_dtype) for layer in self.specs.values() for spec in layer.values())

    def allocate(self, backend: Backend, num_slots: int) -> None:
        """Create every array with ``num_slots`` zeroed rows (again: replaces the arrays, all zeros)."""
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self._backend = backend
        self._arrays = {
            layer: {
                name: backend.zeros((num_slots, *spec.shape), spec.dtype or backend.activation_dtype)
                for name, spec in specs.items()
            }
            for layer, specs in self.specs.items()
        }

    def arrays(self, layer_index: int) -> dict[str, Array]:
        """Layer ``layer_index``'s arrays by name, each ``[num_slots, *shape]`` (mutable in place)."""
        if self._arrays is None:
            raise RuntimeError("recurrent state is used before allocate(): the engine sizes it (model.allocate_state)")
        return self._arrays[layer_index]

    def reset(self, slot: int) -> None:
        """Zero row ``slot`` of every array: the state before a sequence's first token."""
        self._check(slot)
        for layer in self._all():
            for array in layer.values():
                array[slot] = 0

    def copy(self, sources: Sequence[int], destinations: Sequence[int]) -> None:
        """Copy rows ``sources[i] -> destinations[i]`` in every array; all sources are read before any
        destination is written, so the pairs may overlap. The row indices are uploaded once and every
        array is gathered and scattered on the backend (device to device: no state goes through the host)."""
        if len(sources) != len(destinations):
            raise ValueError(f"{len(sources)} sources but {len(destinations)} destinations")
        if not sources:
            return
        for slot in (*sources, *destinations):
            self._check(slot)
        layers = self._all()
        upload = self._backend.from_numpy  # type: ignore[union-attr]  # allocate() set it with the arrays
        src, dst = upload(np.asarray(sources, dtype=np.int32)), upload(np.asarray(destinations, dtype=np.int32))
        for layer in layers:
            for array in layer.values():
                array[dst] = array[src]

    def slot_shapes(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        """``(shape, dtype)`` of one slot's row of every array, in the order `read_slots` returns them."""
        return [(tuple(array.shape[1:]), np.dtype(array.dtype)) for layer in self._all() for array in layer.values()]

    def read_slots(self, slots: Sequence[int]) -> list[np.ndarray]:
        """Host copies of rows ``slots`` of every array, ``[len(slots), *shape]`` each, bit-exact (swap out)."""
        assert self._backend is not None  # allocate() set it with the arrays
        return gather_rows(self._backend, self.slot_arrays(slots), slots)

    def write_slots(self, slots: Sequence[int], rows: Sequence[np.ndarray]) -> None:
        """Store host rows (as `read_slots` returns them) into ``slots``, bit-exact (swap in)."""
        arrays = self.slot_arrays(slots)
        if len(rows) != len(arrays):
            raise ValueError(f"{len(rows)} state arrays given, the state has {len(arrays)}")
        assert self._backend is not None  # allocate() set it with the arrays
        scatter_rows(self._backend, arrays, slots, rows)

    def slot_arrays(self, slots: Sequence[int] = ()) -> list[Array]:
        """Every state array, in `slot_shapes` order (row ``s`` is slot ``s``), after checking that ``slots``
        are in range; for copies of whole slots (`atlas_core.backends.transfers`)."""
        for slot in slots:
            self._check(slot)
        return [array for layer in self._all() for array in layer.values()]

    def _all(self) -> list[dict[str, Array]]:
        if self._arrays is None:
            raise RuntimeError("recurrent state is used before allocate(): the engine sizes it (model.allocate_state)")
        return list(self._arrays.values())

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"state slot {slot} is out of range (the state holds {self.num_slots} slots)")
