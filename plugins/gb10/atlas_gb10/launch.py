"""Kernel launches: CuPy's, or programmatic dependent launches through the CUDA driver.

A programmatic launch (``cuLaunchKernelEx`` with programmatic stream serialization, compute capability 9.0
and later) lets a kernel's blocks start while the kernel before it in the stream is still running; each
block waits in ``await_inputs()`` (``kernels/common.cuh``) until that kernel has finished and its writes
are visible. Captured into a CUDA graph, this overlaps each launch with the previous kernel's tail, which
is most of a small decode kernel's cost. Only kernels whose code holds that wait are launched so
(`compiler.waiting_entries`); every other launch goes through CuPy unchanged.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6
"""``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``."""


def supports_programmatic_launch(arch: str) -> bool:
    """Whether an NVRTC target (``sm_90a``, ``sm_121``, ``sm_80``) has programmatic dependent launches."""
    digits = "".join(ch for ch in arch if ch.isdigit())
    return bool(digits) and int(digits) >= 90


def supports_clusters(arch: str) -> bool:
    """Whether an NVRTC target has thread-block clusters (compute capability 9.0 and later, as for programmatic
    launches)."""
    return supports_programmatic_launch(arch)


def programmatic_launch_available(arch: str) -> bool:
    """Whether programmatic launches can be used here: the target has them and the CUDA driver library offers
    ``cuLaunchKernelEx`` (CUDA 12 and later)."""
    if not supports_programmatic_launch(arch):
        return False
    try:
        return hasattr(cuda_driver(), "cuLaunchKernelEx")
    except (OSError, AttributeError):
        return False


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: a 4-byte id, padding to 8, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [
        ("grid_x", ctypes.c_uint),
        ("grid_y", ctypes.c_uint),
        ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint),
        ("block_y", ctypes.c_uint),
        ("block_z", ctypes.c_uint),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


@functools.cache
def cuda_driver() -> Any:
    """The CUDA driver library with ``cuLaunchKernelEx``'s signature (AttributeError where it lacks it)."""
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuLaunchKernelEx.argtypes = [
        ctypes.POINTER(_LaunchConfig),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    driver.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return driver


def driver_error_name(status: int) -> str:
    """The name of a CUDA driver ``CUresult`` (``CUDA_ERROR_INVALID_VALUE``)."""
    name = ctypes.c_char_p()
    cuda_driver().cuGetErrorName(status, ctypes.byref(name))
    return name.value.decode() if name.value else f"CUresult {status}"


@functools.cache
def _programmatic_attribute() -> _LaunchAttribute:
    attribute = _LaunchAttribute()
    attribute.id = PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value[0] = 1  # programmaticStreamSerializationAllowed
    return attribute


def kernel_argument(value: Any) -> ctypes._SimpleCData | ctypes.Array[ctypes.c_ubyte]:
    """The C value of one kernel argument as CuPy passes it: a device array's pointer, a NumPy scalar's value
    in its own width (a structured one's bytes), a Python int as ``long long``, a float as ``double``, a bool as
    ``bool``."""
    pointer = getattr(getattr(value, "data", None), "ptr", None)
    if pointer is not None:  # a CuPy array
        return ctypes.c_void_p(pointer)
    if isinstance(value, np.void):  # a structure passed by value (a tensor map): its bytes
        return (ctypes.c_ubyte * value.dtype.itemsize).from_buffer_copy(value.tobytes())
    if isinstance(value, np.generic):
        c_type: Any = np.ctypeslib.as_ctypes_type(value.dtype)  # type: ignore[arg-type]
        return c_type(value.item())
    if isinstance(value, bool):
        return ctypes.c_bool(value)
    if isinstance(value, int):
        return ctypes.c_longlong(value)
    if isinstance(value, float):
        return ctypes.c_double(value)
    raise TypeError(f"kernel argument of type {type(value).__name__} cannot be passed to a kernel")


def launch_dims(dims: int | Sequence[int]) -> tuple[int, int, int]:
    """A grid or block shape as CuPy takes it (a number, or up to three) in three dimensions."""
    values = (int(dims),) if isinstance(dims, int | np.integer) else tuple(int(d) for d in dims)
    return (*values, *(1,) * (3 - len(values)))  # type: ignore[return-value]


class Kernel:
    """One kernel of a compiled module, called as CuPy's ``RawKernel`` is: ``kernel(grid, block, args,
    shared_mem=0)``. ``waits``: its code holds ``await_inputs()``; then, while ``library.programmatic`` is
    set, the launch is programmatic on the current stream."""

    def __init__(self, raw: Any, waits: bool, library: Any) -> None:
        self.raw = raw
        self.waits = waits
        self.library = library
        self._shared_opt_in = 0

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return int(self.raw.max_dynamic_shared_size_bytes)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        """The opt-in above 48 KiB, set on the driver once per value (launch paths set it before every call)."""
        if value != self._shared_opt_in:
            self.raw.max_dynamic_shared_size_bytes = value
            self._shared_opt_in = value

    def __call__(
        self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any], shared_mem: int = 0
    ) -> None:
        if not (self.waits and self.library.programmatic):
            self.raw(grid, block, args, shared_mem=shared_mem)
            return
        values = [kernel_argument(arg) for arg in args]
        params = (ctypes.c_void_p * max(len(values), 1))(*(ctypes.addressof(v) for v in values))
        config = _LaunchConfig(
            *launch_dims(grid),
            *launch_dims(block),
            shared_mem,
            self.library.cupy.cuda.get_current_stream().ptr,
            ctypes.pointer(_programmatic_attribute()),
            1,
        )
        status = cuda_driver().cuLaunchKernelEx(ctypes.byref(config), self.raw.kernel.ptr, params, None)
        if status:
            raise RuntimeError(f"launching kernel {self.raw.name}: {driver_error_name(status)}")
