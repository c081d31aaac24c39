"""Run-time compilation of the package's CUDA sources with NVRTC, cached on disk.

A module is compiled once per (source text, included header, constants, target arch, NVRTC version);
the cubin is kept under ``$ATLAS_KERNEL_CACHE`` (default ``~/.cache/atlas-gb10/kernels``), beside the names
of its kernels that wait for their inputs (`waiting_entries`), so a warm start compiles nothing.
`KernelLibrary.compiled` counts the modules this process compiled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from atlas_gb10.hardware import HardwareProfile
from atlas_gb10.launch import Kernel, programmatic_launch_available
from atlas_gb10.registry import KERNEL_DIR, KernelVariant, lookup

log = logging.getLogger("atlas.gb10")

HEADERS = tuple(sorted(path.name for path in KERNEL_DIR.glob("*.cuh")))
"""Headers the sources may include (every .cuh beside them); handed to NVRTC by name."""

CACHE_ENV = "ATLAS_KERNEL_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "atlas-gb10" / "kernels")


def compile_options(variant: KernelVariant, arch: str) -> tuple[str, ...]:
    """NVRTC's options for ``variant`` on ``arch``. No fast-math or flush-to-zero option may be added: the exact
    E4M3 / E2M1 / f16 conversions (``fp8.cuh``, ``gemm_nvfp4.cuh``, ``gemm_gguf.cuh``) rely on float subnormals."""
    return (
        f"-arch={arch}",
        "-std=c++17",
        "--device-as-default-execution-space",
        *(f"-D{name}={value}" for name, value in variant.defines),
    )


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel source; the message holds its log."""


def waiting_entries(ptx: str) -> frozenset[str]:
    """The kernels of a module's PTX whose code waits for the kernels before them (``griddepcontrol.wait``,
    ``await_inputs()`` in ``common.cuh``): the only ones that may be launched programmatically."""
    entries = re.split(r"\.entry\s+", ptx)[1:]
    return frozenset(entry.split("(", 1)[0].strip() for entry in entries if "griddepcontrol.wait" in entry)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:  # atomic for concurrent starts
        tmp.write(data)
    os.replace(tmp.name, path)


class KernelLibrary:
    """Compiled modules of one hardware target; kernels looked up through the registry."""

    def __init__(self, cupy: Any, profile: HardwareProfile) -> None:
        self.cupy = cupy
        self.profile = profile
        self.compiled = 0
        self.programmatic = False
        """Launch the kernels that wait for their inputs programmatically (`launch.py`); set by
        `programmatic_launches`."""
        self._modules: dict[tuple[str, str], tuple[Any, frozenset[str]]] = {}
        self._kernels: dict[tuple[str, str, str], Kernel] = {}
        self._constants: dict[tuple[str, str, str], tuple[int, ...]] = {}

    @contextmanager
    def programmatic_launches(self) -> Iterator[None]:
        """Within: kernel launches are programmatic where the device and driver have them (decode graph
        captures)."""
        previous = self.programmatic
        self.programmatic = programmatic_launch_available(self.profile.arch)
        try:
            yield
        finally:
            self.programmatic = previous

    def variant(self, op: str, dtype: str = "bf16") -> KernelVariant:
        return lookup(self.profile.name, op, dtype)

    def function(self, op: str, name: str, dtype: str = "bf16") -> Kernel:
        """The kernel ``name`` of the module registered for (this target, ``op``, ``dtype``)."""
        key = (op, dtype, name)
        if key not in self._kernels:
            module, waiting = self._module(op, dtype)
            self._kernels[key] = Kernel(module.get_function(name), name in waiting, self)
        return self._kernels[key]

    def constants(self, op: str, name: str, count: int, dtype: str = "bf16") -> tuple[int, ...]:
        """The ``count`` ints of the ``__device__ int name[count]`` array of the module registered for (this
        target, ``op``, ``dtype``): sizes the source computes itself (``sizeof`` of its shared-memory layouts),
        read once per process."""
        key = (op, dtype, name)
        if key not in self._constants:
            pointer = self._module(op, dtype)[0].get_global(name)
            values = self.cupy.ndarray((count,), dtype=self.cupy.int32, memptr=pointer)
            self._constants[key] = tuple(int(x) for x in values.get())
        return self._constants[key]

    def _module(self, op: str, dtype: str) -> tuple[Any, frozenset[str]]:
        if (op, dtype) not in self._modules:
            self._modules[op, dtype] = self._load(self.variant(op, dtype))
        return self._modules[op, dtype]

    def _load(self, variant: KernelVariant) -> tuple[Any, frozenset[str]]:
        """The module of ``variant`` and its kernels that wait for their inputs, from the cache or compiled."""
        from cupy_backends.cuda.libs import nvrtc

        source = (KERNEL_DIR / variant.source).read_text()
        headers = tuple((KERNEL_DIR / h).read_text() for h in HEADERS)
        options = compile_options(variant, self.profile.arch)
        digest = hashlib.sha256(
            "\0".join([source, *headers, *options, ".".join(map(str, nvrtc.getVersion()))]).encode()
        ).hexdigest()[:32]
        path = cache_dir() / f"{Path(variant.source).stem}-{self.profile.arch}-{digest}.cubin"
        waits_path = path.with_suffix(".waits")
        if not (path.exists() and waits_path.exists()):
            cubin, ptx = self._compile(nvrtc, variant.source, source, headers, options)
            _write_atomically(waits_path, "\n".join(sorted(waiting_entries(ptx))).encode())
            _write_atomically(path, cubin)
            self.compiled += 1
            log.info("compiled %s for %s (%s)", variant.source, self.profile.arch, path.name)
        return self.cupy.RawModule(path=str(path)), frozenset(waits_path.read_text().split())

    @staticmethod
    def _compile(
        nvrtc: Any, name: str, source: str, headers: tuple[str, ...], options: tuple[str, ...]
    ) -> tuple[bytes, str]:
        """(cubin, PTX) of one source."""
        program = nvrtc.createProgram(
            source, name, tuple(h.encode() for h in headers), tuple(n.encode() for n in HEADERS)
        )
        try:
            try:
                nvrtc.compileProgram(program, options)
            except nvrtc.NVRTCError as exc:
                raise KernelCompileError(f"{name} ({' '.join(options)}):\n{nvrtc.getProgramLog(program)}") from exc
            return nvrtc.getCUBIN(program), nvrtc.getPTX(program).decode(errors="replace")
        finally:
            nvrtc.destroyProgram(program)
