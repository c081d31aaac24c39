"""How much memory is free for weights on a backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def available_memory(backend: Any) -> tuple[int, str] | None:
    """``(bytes, where)`` free for weights: device memory on device backends, the host's available
    memory (``MemAvailable`` of ``/proc/meminfo``) on host backends; None when it cannot be told."""
    device = backend.device_memory()
    if device is not None:
        return int(device[0]), "free device memory"
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            found += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")]
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":  # a cgroup v2 limit below the host's memory
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return (min(found), "available host memory") if found else None


def weight_itemsize(backend: Any) -> int:
    """Bytes a float weight takes on ``backend`` once uploaded (`Backend.from_numpy` with ``weight=True``)."""
    return int(backend.from_numpy(np.zeros(1, np.float32), weight=True).dtype.itemsize)
