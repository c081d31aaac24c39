"""Cold start: seconds from launching ``atlas serve [MODEL] --backend cuda`` to its ready line.

Run it twice: the first run fills the kernel cache, the second (a warm kernel cache) is the figure.
Usage: python cold_start.py [MODEL] [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def once(model: list[str]) -> float:
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "atlas_core.cli", "serve", *model, "--backend", "cuda", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("atlas ready"):
                return time.perf_counter() - start
        raise RuntimeError(f"atlas serve exited with {process.wait()} before its ready line")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    model = [args.model] if args.model else []
    times = [once(model) for _ in range(args.runs)]
    print(
        f"cold start {args.model or 'default model'}: "
        + ", ".join(f"{t:.2f} s" for t in times)
        + " (the first run may compile kernels; the rest start with a warm kernel cache)"
    )


if __name__ == "__main__":
    main()
