"""`CudaHostTransfers`: the KV storage tiers' device <-> host copies on their own stream, through pinned
host buffers (the contract: `atlas_core.backends.transfers`).

- **gather** (swap-out, spill): the rows are gathered into a fresh device array on the compute stream (the
  current one), in order with the model's kernels, so later kernels may overwrite the rows at once; an event
  after the gather lets the copy stream move that array to pinned host memory while the compute stream goes
  on. The wait (called on the storage I/O thread) synchronises with the copy's event.
- **scatter** (swap-in, spilled hits): on the copy stream, after an event of the compute stream (earlier kernels,
  such as the gathers of those rows' old contents, come first), the host rows are sent to a device array and
  scattered into the rows. Rows in pinned memory (the tiers read records back into `host_rows`, which are) go
  as they are; others are first copied into pinned memory. `done` queries the copy's event; `fence` makes the
  compute stream wait for it.

Device arrays and pinned buffers that a copy in flight uses are kept (`_in_flight`) until its event has
completed; they are released on the engine thread, on a later call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.transfers import HostTransfers, Transfer
from atlas_core.storage.backend import RecordFormat

PINNED_HOST = 1
"""`cudaMemoryTypeHost`: what `cudaPointerGetAttributes` reports for page-locked host memory."""


class _CudaTransfer:
    """A scatter in flight: its event on the copy stream."""

    def __init__(self, cupy: Any, event: Any) -> None:
        self.cp, self.event = cupy, event

    def done(self) -> bool:
        return bool(self.event.done)

    def fence(self) -> None:
        self.cp.cuda.get_current_stream().wait_event(self.event)


class CudaHostTransfers(HostTransfers):
    """Row copies between CuPy arrays and the host on one non-blocking copy stream (engine thread only; the
    waits `gather` returns may run on any thread)."""

    def __init__(self, backend: Backend, cupy: Any) -> None:
        super().__init__(backend)
        self.cp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._in_flight: list[tuple[Any, list[Any]]] = []  # (event, what the copy uses)

    def gather(self, arrays: Sequence[Array], rows: Sequence[int]) -> Callable[[], list[np.ndarray]]:
        cp = self._cp_pruned()
        index = self.backend.from_numpy(np.asarray(rows, dtype=np.int32))  # asynchronous, on the compute stream
        parts = [cp.ascontiguousarray(array[index]) for array in arrays]  # compute stream, in order
        gathered = self._event(cp.cuda.get_current_stream())
        self.stream.wait_event(gathered)
        hosts = [self._pinned_empty(part.shape, part.dtype) for part in parts]
        for part, host in zip(parts, hosts, strict=True):
            part.data.copy_to_host_async(host.ctypes.data, part.nbytes, self.stream)
        keep = [index, *parts, *hosts]  # the buffers go back to the pinned pool once the copies are done
        copied = self._event(self.stream, blocking=True)
        self._in_flight.append((copied, keep))
        device = cp.cuda.Device()  # the engine's; the wait may run on a thread where it is not current

        def wait() -> list[np.ndarray]:
            with device:
                copied.synchronize()
            return hosts

        return wait

    def host_rows(self, format: RecordFormat, count: int) -> list[np.ndarray]:
        """Pinned arrays (from CuPy's pinned memory pool), so that `scatter` sends them without a copy."""
        return [self._pinned_empty((count, *shape), dtype) for shape, dtype in format.arrays]

    def scatter(self, arrays: Sequence[Array], rows: Sequence[int], values: Sequence[np.ndarray]) -> Transfer:
        if len(values) != len(arrays):
            raise ValueError(f"{len(values)} arrays of values for {len(arrays)} arrays")
        cp = self._cp_pruned()
        self.stream.wait_event(self._event(cp.cuda.get_current_stream()))
        keep: list[Any] = []
        with self.stream:
            index = self._upload(np.asarray(rows, dtype=np.int32), np.dtype(np.int32), keep)
            for array, value in zip(arrays, values, strict=True):
                array[index] = self._upload(value, np.dtype(array.dtype), keep)
        done = self._event(self.stream)
        self._in_flight.append((done, keep))
        return _CudaTransfer(cp, done)

    def _upload(self, host: np.ndarray, dtype: np.dtype, keep: list[Any]) -> Any:
        """A device copy of ``host`` (bit-exact: its bytes, viewed as ``dtype``) sent through pinned memory on
        the copy stream (the current one); the pinned rows and the device array join ``keep``."""
        source = np.ascontiguousarray(host)
        if source.dtype != dtype:
            raise TypeError(f"rows of dtype {source.dtype} cannot be stored bit-exact into an array of {dtype}")
        device = self.cp.empty(source.shape, dtype=dtype)
        if source.nbytes and self._pinned(source):
            staged = source  # kept, unchanged until the copy is done (`scatter`'s contract)
        else:
            staged = self._pinned_empty((source.nbytes,), np.dtype(np.uint8))
            staged[...] = source.reshape(-1).view(np.uint8)
        device.data.copy_from_host_async(staged.ctypes.data, source.nbytes, self.stream)
        keep += [staged, device]
        return device

    def _pinned_empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised host array in pinned memory from CuPy's pool (the array keeps its buffer alive)."""
        size = int(np.prod(shape, dtype=np.int64))
        buffer = self.cp.cuda.alloc_pinned_memory(max(size * np.dtype(dtype).itemsize, 1))
        return np.frombuffer(buffer, dtype=dtype, count=size).reshape(shape)

    def _pinned(self, host: np.ndarray) -> bool:
        """Whether ``host``'s memory is page-locked (the device may copy from it directly)."""
        attributes = self.cp.cuda.runtime.pointerGetAttributes(host.ctypes.data)
        return bool(attributes.type == PINNED_HOST)

    def _event(self, stream: Any, *, blocking: bool = False) -> Any:
        event = self.cp.cuda.Event(block=blocking, disable_timing=True)
        event.record(stream)
        return event

    def _cp_pruned(self) -> Any:
        """CuPy, after releasing what completed copies used."""
        self._in_flight = [(event, keep) for event, keep in self._in_flight if not event.done]
        return self.cp
