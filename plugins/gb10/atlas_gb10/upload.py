"""Host -> device copies through pinned staging buffers.

Large arrays (weights) are converted to their device dtype while being copied into one of two pinned
buffers, and each buffer is sent with an asynchronous copy while the other one is being filled.
Small arrays (per-step metadata) are copied into one of a ring of small pinned slots and sent with an
asynchronous copy on the current stream, ordered before the kernels that read them, so the host does
not wait for the copy; a slot is reused only once its last copy is done. Metadata larger than a slot (the block
tables of hundreds of long sequences) is staged the same way in pinned memory of its own, held until its copy is
done: a copy from pageable memory would make the host wait for the device's queued work (a decode step queued
ahead, `atlas_core.engine.ahead`) before it returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

SMALL_BYTES = 1 << 20
"""Arrays up to this size skip the large-array staging buffers: they are staged for an asynchronous copy on the
current stream (CuPy's own copy while a graph is being captured)."""
SLOT_BYTES, SLOTS = 64 << 10, 64
"""The ring of pinned slots for small arrays (per-step metadata); larger small arrays take pinned memory of their
own."""


class PinnedUploader:
    """Uploads host arrays, converting dtypes on the way, ``chunk_bytes`` at a time per staging buffer."""

    def __init__(self, cupy: Any, chunk_bytes: int = 64 << 20) -> None:
        self.cp = cupy
        self.chunk_bytes = chunk_bytes
        self._buffers: list[Any] = []
        self._events: list[Any] = []
        self._next = 0
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._slots: Any = None
        self._slot_events: list[Any] = [None] * SLOTS
        self._next_slot = 0
        self._in_flight: deque[tuple[Any, Any]] = deque()  # (event, pinned memory) of copies too large for a slot

    def _staging(self) -> tuple[Any, Any]:
        if not self._buffers:
            for _ in range(2):
                self._buffers.append(self.cp.cuda.alloc_pinned_memory(self.chunk_bytes))
                self._events.append(None)
        index = self._next
        self._next = (self._next + 1) % len(self._buffers)
        if self._events[index] is not None:
            self._events[index].synchronize()  # the copy that last used this buffer is done
        return index, self._buffers[index]

    def upload(self, host: np.ndarray, dtype: np.dtype) -> Any:
        """A new device array with ``host``'s values in ``dtype`` (C order)."""
        cp = self.cp
        dtype = np.dtype(dtype)
        nbytes = host.size * dtype.itemsize
        capturing = cp.cuda.get_current_stream().is_capturing()
        if nbytes <= SMALL_BYTES and not capturing:
            return self._upload_small(host, dtype)  # never while capturing: a graph would re-read the staging
        if nbytes <= SMALL_BYTES:
            return cp.asarray(np.ascontiguousarray(host, dtype=dtype))
        out = cp.empty(host.shape, dtype=dtype)
        source = np.ascontiguousarray(host).reshape(-1)
        per_chunk = max(1, self.chunk_bytes // dtype.itemsize)
        flat = out.reshape(-1)
        for start in range(0, source.size, per_chunk):
            count = min(per_chunk, source.size - start)
            index, buffer = self._staging()
            staged = np.frombuffer(buffer, dtype=dtype, count=count)
            staged[...] = source[start : start + count]  # dtype conversion happens here, on the host
            flat[start : start + count].data.copy_from_host_async(
                staged.ctypes.data, count * dtype.itemsize, self._stream
            )
            event = cp.cuda.Event()
            event.record(self._stream)
            self._events[index] = event
        self._stream.synchronize()
        return out

    def upload_int32(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """int32 copies of small host arrays through one pinned slot and one asynchronous copy: views of one device
        buffer, each starting on a 16-byte boundary, of the arrays' shapes. One by one (`upload`) while capturing
        or when together they do not fit a slot."""
        cp = self.cp
        hosts = [np.asarray(array) for array in arrays]
        starts, total = [], 0
        for host in hosts:
            starts.append(total)
            total += -(-host.size // 4) * 4
        if total * 4 > SMALL_BYTES or cp.cuda.get_current_stream().is_capturing():
            return [self.upload(host, np.dtype(np.int32)) for host in hosts]
        flat = cp.empty(max(total, 1), dtype=np.int32)
        holder, staged = self._stage(np.dtype(np.int32), total)
        for host, start in zip(hosts, starts, strict=True):
            staged[start : start + host.size] = host.reshape(-1)
        self._send(flat, holder, staged)
        views = []
        for host, start in zip(hosts, starts, strict=True):
            view = flat[start : start + host.size]
            views.append(view if host.ndim == 1 else view.reshape(host.shape))
        return views

    def _upload_small(self, host: np.ndarray, dtype: np.dtype) -> Any:
        """Through the next pinned slot, asynchronously on the current stream."""
        out = self.cp.empty(host.shape, dtype=dtype)
        if out.size == 0:
            return out
        holder, staged = self._stage(dtype, out.size)
        staged[...] = np.asarray(host).reshape(-1)
        self._send(out, holder, staged)
        return out

    def _stage(self, dtype: np.dtype, count: int) -> tuple[Any, np.ndarray]:
        """Pinned host memory for ``count`` elements of ``dtype`` and what holds it until its copy is done: the next
        slot of the ring (its index) when they fit one, else pinned memory of their own."""
        if count * dtype.itemsize <= SLOT_BYTES:
            return self._slot(dtype, count)
        while self._in_flight and self._in_flight[0][0].done:
            self._in_flight.popleft()
        memory = self.cp.cuda.alloc_pinned_memory(count * dtype.itemsize)
        return memory, np.frombuffer(memory, dtype=dtype, count=count)

    def _slot(self, dtype: np.dtype, count: int) -> tuple[int, np.ndarray]:
        """The next pinned slot, once its previous copy is done, as ``count`` elements of ``dtype``."""
        if self._slots is None:
            self._slots = self.cp.cuda.alloc_pinned_memory(SLOT_BYTES * SLOTS)
        index = self._next_slot
        self._next_slot = (index + 1) % SLOTS
        if self._slot_events[index] is not None:
            self._slot_events[index].synchronize()
        return index, np.frombuffer(self._slots, dtype=dtype, count=count, offset=index * SLOT_BYTES)

    def _send(self, out: Any, holder: Any, staged: np.ndarray) -> None:
        """Copy the staged bytes (`_stage`) into the start of ``out`` on the current stream; their slot or pinned
        memory (``holder``) is free once the copy is done."""
        stream = self.cp.cuda.get_current_stream()
        out.data.copy_from_host_async(staged.ctypes.data, staged.nbytes, stream)
        if isinstance(holder, int):
            event = self._slot_events[holder]
            if event is None:
                event = self._slot_events[holder] = self.cp.cuda.Event(disable_timing=True)
        else:
            event = self.cp.cuda.Event(disable_timing=True)
            self._in_flight.append((event, holder))
        event.record(stream)
