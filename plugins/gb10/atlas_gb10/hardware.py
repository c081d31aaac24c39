"""Hardware profiles: what the kernel registry and the launch heuristics know about each target.

A profile names a target of the kernel registry (``gb10``, ``hopper``, or ``generic`` for any other
CUDA GPU) and carries its datasheet figures. `detect` matches the current device by compute
capability and fills in what the device itself reports (SM count, shared memory per block).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class HardwareProfile:
    """One hardware target.

    ``arch`` is the NVRTC target (``sm_121``, ``sm_90a``, ...); ``matrix_instructions`` names the
    tensor-core path the kernels use there; ``memory_bandwidth_gbs`` is the datasheet figure (the
    benchmarks measure their own ceiling); ``shared_memory_per_block`` is the opt-in maximum in bytes.
    """

    name: str
    description: str
    arch: str
    cpu: str
    sm_count: int
    memory_bandwidth_gbs: float
    shared_memory_per_block: int
    matrix_instructions: str


GB10 = HardwareProfile(
    name="gb10",
    description="NVIDIA GB10 Grace Blackwell superchip",
    arch="sm_121",
    cpu="aarch64",
    sm_count=48,
    memory_bandwidth_gbs=273.0,
    shared_memory_per_block=99 * 1024,
    matrix_instructions="mma.sync (no wgmma)",
)
HOPPER = HardwareProfile(
    name="hopper",
    description="NVIDIA Hopper (H100 / H200)",
    arch="sm_90a",
    cpu="x86_64 or aarch64",
    sm_count=132,
    memory_bandwidth_gbs=3350.0,
    shared_memory_per_block=227 * 1024,
    matrix_instructions="mma.sync; wgmma for prefill-sized products",
)
PROFILES: dict[tuple[int, int], HardwareProfile] = {(12, 1): GB10, (9, 0): HOPPER}
"""Known targets by compute capability."""


def generic_profile(major: int, minor: int) -> HardwareProfile:
    """Any other CUDA GPU (compute capability 8.0 or newer: the kernels use mma.sync bf16)."""
    return HardwareProfile(
        name="generic",
        description=f"CUDA GPU of compute capability {major}.{minor}",
        arch=f"sm_{major}{minor}",
        cpu="any",
        sm_count=0,
        memory_bandwidth_gbs=0.0,
        shared_memory_per_block=48 * 1024,
        matrix_instructions="mma.sync",
    )


def detect(cupy: Any) -> HardwareProfile:
    """The profile of the current CUDA device, with its reported SM count and shared-memory limit."""
    device = cupy.cuda.Device()
    capability = str(device.compute_capability)  # "90", "121"
    major, minor = int(capability[:-1]), int(capability[-1])
    attributes = device.attributes
    profile = PROFILES.get((major, minor)) or generic_profile(major, minor)
    return replace(
        profile,
        sm_count=int(attributes["MultiProcessorCount"]),
        shared_memory_per_block=int(attributes.get("MaxSharedMemoryPerBlockOptin", profile.shared_memory_per_block)),
    )


def has_wgmma(arch: str) -> bool:
    """Whether kernels compiled for ``arch`` have Hopper's warpgroup matrix instructions (wgmma: sm_90a only)."""
    return arch == "sm_90a"
