"""Run-time compilation of the package's CUDA sources with NVRTC, cached on disk.

A module is compiled once per (source text, included header, constants, target arch, NVRTC version);
the cubin is kept under ``$ATLAS_KERNEL_CACHE`` (default ``~/.cache/atlas-gb10/kernels``), so a warm
start compiles nothing. `KernelLibrary.compiled` counts the modules this process compiled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from atlas_gb10.hardware import HardwareProfile
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


class KernelLibrary:
    """Compiled modules of one hardware target; kernels looked up through the registry."""

    def __init__(self, cupy: Any, profile: HardwareProfile) -> None:
        self.cupy = cupy
        self.profile = profile
        self.compiled = 0
        self._modules: dict[tuple[str, str], Any] = {}

    def variant(self, op: str, dtype: str = "bf16") -> KernelVariant:
        return lookup(self.profile.name, op, dtype)

    def function(self, op: str, name: str, dtype: str = "bf16") -> Any:
        """The kernel ``name`` of the module registered for (this target, ``op``, ``dtype``)."""
        key = (op, dtype)
        if key not in self._modules:
            self._modules[key] = self._load(self.variant(op, dtype))
        return self._modules[key].get_function(name)

    def _load(self, variant: KernelVariant) -> Any:
        from cupy_backends.cuda.libs import nvrtc

        source = (KERNEL_DIR / variant.source).read_text()
        headers = tuple((KERNEL_DIR / h).read_text() for h in HEADERS)
        options = compile_options(variant, self.profile.arch)
        digest = hashlib.sha256(
            "\0".join([source, *headers, *options, ".".join(map(str, nvrtc.getVersion()))]).encode()
        ).hexdigest()[:32]
        path = cache_dir() / f"{Path(variant.source).stem}-{self.profile.arch}-{digest}.cubin"
        if not path.exists():
            cubin = self._compile(nvrtc, variant.source, source, headers, options)
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:  # atomic for concurrent starts
                tmp.write(cubin)
            os.replace(tmp.name, path)
            self.compiled += 1
            log.info("compiled %s for %s (%s)", variant.source, self.profile.arch, path.name)
        return self.cupy.RawModule(path=str(path))

    @staticmethod
    def _compile(nvrtc: Any, name: str, source: str, headers: tuple[str, ...], options: tuple[str, ...]) -> bytes:
        program = nvrtc.createProgram(
            source, name, tuple(h.encode() for h in headers), tuple(n.encode() for n in HEADERS)
        )
        try:
            try:
                nvrtc.compileProgram(program, options)
            except nvrtc.NVRTCError as exc:
                raise KernelCompileError(f"{name} ({' '.join(options)}):\n{nvrtc.getProgramLog(program)}") from exc
            return nvrtc.getCUBIN(program)
        finally:
            nvrtc.destroyProgram(program)
