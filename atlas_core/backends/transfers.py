"""`HostTransfers`: copies of rows of backend arrays (KV blocks, recurrent-state slots) between the device and
the host, started without waiting, for the KV storage tiers (`atlas_core.engine.kv_offload`).

Ordering contract (the "compute stream" is where the backend runs the model's ops; a host backend has only
that):

- `HostTransfers.gather` reads the rows as they are after every op issued before it, and ops issued after it
  may overwrite them at once: the engine frees a swapped-out sequence's blocks right after starting their copy.
- `HostTransfers.scatter` writes the rows after every op issued before it (a block's previous contents are
  gathered first); ops issued after it see the new values once `Transfer.done` has returned True, or at once
  after `Transfer.fence`. The engine schedules a sequence whose blocks are coming in only after `done`.
- `HostTransfers.host_rows` gives the host arrays the tiers read records back into: on the CUDA backend they
  live in pinned memory, so `scatter` sends them to the device without another copy.

The base class is synchronous (the NumPy backend, and the fallback of any backend): both copies are complete
when the call returns. The CUDA backend (atlas-gb10) runs them on their own stream through pinned host
buffers, so they overlap the model's kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from atlas_core.backends.base import Array, Backend
    from atlas_core.storage.backend import RecordFormat


class Transfer(Protocol):
    """A started host -> device copy (`HostTransfers.scatter`)."""

    def done(self) -> bool:
        """True once the rows hold the new values for every op issued from now on (never blocks)."""
        ...

    def fence(self) -> None:
        """Make every op issued from now on wait for the copy (a cancelled load whose blocks are freed)."""
        ...


class Finished:
    """A transfer that completed before it was returned."""

    def done(self) -> bool:
        return True

    def fence(self) -> None:
        pass


def gather_rows(backend: Backend, arrays: Sequence[Array], rows: Sequence[int]) -> list[np.ndarray]:
    """Host copies of ``rows`` of each array, ``[len(rows), *row shape]`` in the array's dtype, bit-exact."""
    index = backend.from_numpy(np.asarray(rows, dtype=np.int32))
    return [backend.to_numpy(array[index]) for array in arrays]


def scatter_rows(backend: Backend, arrays: Sequence[Array], rows: Sequence[int], values: Sequence[np.ndarray]) -> None:
    """Store host ``values`` (as `gather_rows` returns them) into ``rows`` of each array, bit-exact."""
    if len(values) != len(arrays):
        raise ValueError(f"{len(values)} arrays of values for {len(arrays)} arrays")
    index = backend.from_numpy(np.asarray(rows, dtype=np.int32))
    for array, value in zip(arrays, values, strict=True):
        array[index] = backend.from_numpy(value, dtype=np.dtype(array.dtype))


class HostTransfers:
    """Device <-> host row copies of one backend (see the module docstring for the ordering contract).

    Called from the engine thread only; the wait that `gather` returns may be called from any thread (the
    storage tiers' I/O thread calls it before writing the rows to a tier)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def gather(self, arrays: Sequence[Array], rows: Sequence[int]) -> Callable[[], list[np.ndarray]]:
        """Start copying ``rows`` of each array to the host; the returned wait gives the host copies
        (`gather_rows`' shapes). Here the copy is done before this returns."""
        copies = gather_rows(self.backend, arrays, rows)
        return lambda: copies

    def host_rows(self, format: RecordFormat, count: int) -> list[np.ndarray]:
        """Host arrays for ``count`` records of ``format`` (uninitialised, as `RecordFormat.empty`), for values
        that `scatter` will send to the device. Here plain NumPy arrays."""
        return format.empty(count)

    def scatter(self, arrays: Sequence[Array], rows: Sequence[int], values: Sequence[np.ndarray]) -> Transfer:
        """Start storing ``values`` into ``rows`` of each array. ``values`` may be reused once this returns,
        except arrays from `host_rows` (or views of them), which must stay unchanged until the transfer is done.
        Here the copy is done before this returns."""
        scatter_rows(self.backend, arrays, rows, values)
        return Finished()
