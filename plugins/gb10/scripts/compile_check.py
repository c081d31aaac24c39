"""Compile every registered kernel variant with nvcc for Hopper (sm_90a) and GB10 (sm_121).

No GPU is needed. Prints one line per (variant, arch) with registers and spills; exits 1 on any
compile error. Usage: python plugins/gb10/scripts/compile_check.py [--nvcc PATH]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from atlas_gb10.registry import KERNEL_DIR, all_variants

TARGETS = {"sm_90a": "-gencode=arch=compute_90a,code=sm_90a", "sm_121": "-gencode=arch=compute_121,code=sm_121"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nvcc", default="nvcc")
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for (target, op, dtype), variant in all_variants():
            for arch, flag in TARGETS.items():
                defines = [f"-D{name}={value}" for name, value in variant.defines]
                cmd = [
                    args.nvcc,
                    flag,
                    "-std=c++17",
                    "-cubin",
                    "-Xptxas",
                    "-v",
                    *defines,
                    "-o",
                    f"{tmp}/out.cubin",
                    str(KERNEL_DIR / variant.source),
                ]
                result = subprocess.run(cmd, capture_output=True, text=True, check=False)
                log = result.stdout + result.stderr
                spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log))
                registers = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
                status = "ok" if result.returncode == 0 else "FAILED"
                print(
                    f"{status:6} {arch:7} {target}/{op}/{dtype} {variant.source} {' '.join(defines)}: "
                    f"{len(registers)} kernels, max {max(registers, default=0)} registers, {spills} bytes spilled"
                )
                if result.returncode:
                    failures += 1
                    print(log)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
