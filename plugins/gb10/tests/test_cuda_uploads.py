"""The cuda backend's host -> device copies of per-step metadata (`atlas_gb10/upload.py`): one pinned copy for a
step's arrays, and metadata larger than a slot staged without waiting for queued device work. Needs a CUDA GPU;
skipped with the backend's own reason elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def test_a_steps_metadata_uploads_in_one_copy(backend: CudaBackend) -> None:
    """`upload_int32` sends several small arrays through one pinned slot: each comes back with its values and
    shape, 16-byte aligned, also when the slot ring has gone round and for empty arrays; too much for one slot
    goes one by one."""
    rng = np.random.default_rng(5)
    for _ in range(80):  # more than the ring's slots
        hosts = [rng.integers(-(2**31), 2**31, size=n, dtype=np.int64).astype(np.int32) for n in rng.integers(0, 40, 5)]
        hosts.append(rng.integers(-1, 1000, size=(3, 7)))
        uploaded = backend.upload_int32(hosts)
        for host, device in zip(hosts, uploaded, strict=True):
            assert device.dtype == np.int32 and device.shape == host.shape
            assert device.data.ptr % 16 == 0
            np.testing.assert_array_equal(backend.to_numpy(device), host.astype(np.int32))
    large = [np.arange(20000), np.arange(3)]
    for host, device in zip(large, backend.upload_int32(large), strict=True):
        np.testing.assert_array_equal(backend.to_numpy(device), host)


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


def test_metadata_larger_than_a_slot_uploads_without_waiting_for_queued_work(backend: CudaBackend) -> None:
    """Block tables of many long sequences (more than a pinned slot) are staged in pinned memory of their own: the
    host does not wait for the kernels queued before the copy (a decode step queued ahead), and the values arrive."""
    cp = backend.cp
    spin = cp.RawKernel(SPIN, "spin")
    tables = np.arange(256 * 128, dtype=np.int32).reshape(256, 128)  # 128 KiB: two slots' worth
    for _ in range(3):  # the pinned memory of a finished copy is released and taken again
        stream = cp.cuda.get_current_stream()
        spin((1,), (1,), (np.int64(400_000_000),))  # about 0.2-0.3 s at the SMs' clock
        uploaded = backend.upload_int32([tables, np.arange(5)])
        assert not stream.done, "the upload waited for the kernel queued before it"
        np.testing.assert_array_equal(backend.to_numpy(uploaded[0]), tables)
        np.testing.assert_array_equal(backend.to_numpy(uploaded[1]), np.arange(5))
