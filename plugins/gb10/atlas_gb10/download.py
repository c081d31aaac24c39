"""Device -> host copies that do not wait for later work: `CudaBackend.download_async`.

The array is copied into fresh pinned memory (CuPy's pinned pool) asynchronously on the current stream, and an
event recorded after the copy; `result` waits for that event only, so kernels queued after the copy (the next
decode step, `atlas_core.engine.ahead`) keep running. Each download owns its pinned memory until it is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PinnedDownload:
    """One asynchronous copy of a device array into pinned host memory (`atlas_core.backends.base.Download`)."""

    def __init__(self, cupy: Any, array: Any) -> None:
        array = cupy.ascontiguousarray(array)
        self.shape, self.dtype = array.shape, array.dtype
        self._memory = cupy.cuda.alloc_pinned_memory(max(array.nbytes, 1))
        stream = cupy.cuda.get_current_stream()
        if array.nbytes:
            array.data.copy_to_host_async(self._memory.ptr, array.nbytes, stream)
        self._event = cupy.cuda.Event(disable_timing=True)
        self._event.record(stream)

    def result(self) -> np.ndarray:
        """The array on the host, once its copy is done."""
        self._event.synchronize()
        count = int(np.prod(self.shape, dtype=np.int64))
        return np.frombuffer(self._memory, dtype=self.dtype, count=count).reshape(self.shape).copy()
