"""Compile every registered kernel variant with nvcc for Hopper (sm_90a) and GB10 (sm_121).

No GPU is needed. Compiles as many at once as there are CPUs; prints one line per (variant, arch) with
registers and spills, in registry order; exits 1 on any compile error, and on any "Potential Performance Loss"
from ptxas (such as C7518: wgmma instructions serialised), which is a speed bug of a Hopper kernel.
Usage: python plugins/gb10/scripts/compile_check.py [--nvcc PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from atlas_gb10.registry import KERNEL_DIR, KernelVariant, all_variants

TARGETS = {"sm_90a": "-gencode=arch=compute_90a,code=sm_90a", "sm_121": "-gencode=arch=compute_121,code=sm_121"}


def compile_one(nvcc: str, tmp: str, key: tuple[str, str, str], variant: KernelVariant, arch: str) -> tuple[bool, str]:
    """Compile one (variant, arch) into its own cubin: whether it compiled without a ptxas performance warning,
    and its report line (with the log, or the warnings, on failure)."""
    target, op, dtype = key
    defines = [f"-D{name}={value}" for name, value in variant.defines]
    cubin = f"{tmp}/{target}_{op}_{dtype}_{arch}.cubin"
    cmd = [nvcc, TARGETS[arch], "-std=c++17", "-cubin", "-Xptxas", "-v", *defines, "-o", cubin]
    result = subprocess.run([*cmd, str(KERNEL_DIR / variant.source)], capture_output=True, text=True, check=False)
    log = result.stdout + result.stderr
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log))
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    losses = [line for line in log.splitlines() if "Potential Performance Loss" in line]
    ok = result.returncode == 0 and not losses
    status = "ok" if ok else "FAILED" if result.returncode else "SLOW"
    line = (
        f"{status:6} {arch:7} {target}/{op}/{dtype} {variant.source} {' '.join(defines)}: "
        f"{len(registers)} kernels, max {max(registers, default=0)} registers, {spills} bytes spilled"
    )
    return ok, line if ok else f"{line}\n" + ("\n".join(losses) if result.returncode == 0 else log)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nvcc", default="nvcc")
    args = parser.parse_args()
    jobs = [(key, variant, arch) for key, variant in all_variants() for arch in TARGETS]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda job: compile_one(args.nvcc, tmp, *job), jobs))
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
