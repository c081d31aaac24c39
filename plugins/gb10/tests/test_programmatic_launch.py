"""Programmatic dependent launches without a GPU: every kernel waits for its inputs first, the PTX scan that
decides which kernels may be launched so, and the driver-call argument packing."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from atlas_gb10.compiler import KernelLibrary, waiting_entries
from atlas_gb10.hardware import GB10, HOPPER, generic_profile
from atlas_gb10.launch import (
    Kernel,
    kernel_argument,
    launch_dims,
    programmatic_launch_available,
    supports_programmatic_launch,
)
from atlas_gb10.registry import KERNEL_DIR

KERNEL_START = re.compile(r'extern "C" __global__[^{]*\{((?:[\s\\]*prefetch_l2\([^;]*\);)*)[\s\\]*(\S+)')


def test_every_kernel_starts_by_waiting_for_its_inputs() -> None:
    """A kernel launched programmatically may start before the one it reads from has finished: its first
    statement must be ``await_inputs()`` (anything before it could read or write too early), after nothing but
    ``prefetch_l2`` calls (which warm the L2 with weights no kernel writes)."""
    kernels = prefetching = 0
    for source in sorted(KERNEL_DIR.glob("*.cu")):
        text = source.read_text()
        declared = text.count('extern "C" __global__')
        starts = KERNEL_START.findall(text)
        assert len(starts) == declared, source.name
        late = [first for _, first in starts if first != "await_inputs();"]
        assert not late, f"{source.name}: kernels whose first statement is not await_inputs(): {late}"
        kernels += declared
        prefetching += sum(1 for prefetches, _ in starts if prefetches)
    assert kernels > 40 and prefetching > 0


PTX = """
.visible .entry waits(
    .param .u64 waits_param_0
)
{
    griddepcontrol.wait;
    ret;
}
.visible .entry plain(
    .param .u64 plain_param_0
)
{
    ret;
}
"""


def test_only_entries_whose_code_waits_are_listed() -> None:
    assert waiting_entries(PTX) == frozenset({"waits"})
    assert waiting_entries("") == frozenset()


def test_programmatic_launches_need_compute_capability_9() -> None:
    assert supports_programmatic_launch(HOPPER.arch)
    assert supports_programmatic_launch(GB10.arch)
    assert not supports_programmatic_launch(generic_profile(8, 9).arch)


class _Array:
    """What `kernel_argument` reads of a CuPy array: ``data.ptr``."""

    class data:  # noqa: N801 - mirrors cupy.ndarray.data
        ptr = 0x7F0000001000


@pytest.mark.parametrize(
    ("value", "c_type", "expected"),
    [
        (_Array(), ctypes.c_void_p, 0x7F0000001000),
        (np.int32(-3), ctypes.c_int32, -3),
        (np.int64(1 << 40), ctypes.c_int64, 1 << 40),
        (np.uint64(0), ctypes.c_uint64, 0),
        (np.float32(0.5), ctypes.c_float, 0.5),
        (7, ctypes.c_longlong, 7),
        (0.25, ctypes.c_double, 0.25),
    ],
)
def test_kernel_arguments_keep_their_c_width(value: object, c_type: type, expected: float) -> None:
    argument = kernel_argument(value)
    assert isinstance(argument, c_type)
    assert argument.value == expected


def test_a_host_array_is_refused_with_its_type() -> None:
    with pytest.raises(TypeError, match="ndarray"):
        kernel_argument(np.zeros(3))


class _RawKernel:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid: object, block: object, args: object, shared_mem: int = 0) -> None:
        self.calls.append((grid, block, args, shared_mem))


def test_launches_go_through_cupy_outside_programmatic_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("atlas_gb10.compiler.programmatic_launch_available", supports_programmatic_launch)
    library = KernelLibrary(cupy=None, profile=HOPPER)
    raw = _RawKernel()
    kernel = Kernel(raw, waits=True, library=library)
    kernel.max_dynamic_shared_size_bytes = 64 * 1024
    kernel((2, 3), (128,), (np.int32(1),), shared_mem=64 * 1024)
    assert raw.calls == [((2, 3), (128,), (np.int32(1),), 64 * 1024)]
    assert raw.max_dynamic_shared_size_bytes == 64 * 1024
    with library.programmatic_launches():
        assert library.programmatic
        Kernel(raw, waits=False, library=library)((1,), (32,), ())  # no wait in its code: a plain launch
    assert not library.programmatic
    assert len(raw.calls) == 2


def test_devices_before_compute_capability_9_never_launch_programmatically() -> None:
    library = KernelLibrary(cupy=None, profile=generic_profile(8, 9))
    with library.programmatic_launches():
        assert not library.programmatic


def test_without_a_driver_that_has_them_launches_are_not_programmatic(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr("atlas_gb10.launch.cuda_driver", no_driver)
    assert not programmatic_launch_available(HOPPER.arch)


def test_grid_and_block_shapes_take_three_dimensions() -> None:
    assert launch_dims(7) == (7, 1, 1)
    assert launch_dims(np.int64(7)) == (7, 1, 1)
    assert launch_dims((4, np.int32(2))) == (4, 2, 1)
    assert launch_dims((1, 2, 3)) == (1, 2, 3)
