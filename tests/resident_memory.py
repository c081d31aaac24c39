"""Resident memory of a model loaded and run in a fresh process, for the tests that check a quantized
checkpoint takes about its file size in memory (tests/test_fp8_memory.py, tests/test_gguf_memory.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RSS_SLACK_BYTES = 16 * 2**20
"""Process growth allowed beyond the file's size: the embedding and LM head in float32 (a few MiB for
the tests' models), a 4 MiB KV cache, interpreter objects. A float32 copy of the quantized weights would
add three (FP8) to six (Q4_K) times the file."""

RSS_PROBE = """
import ctypes, gc, sys
from atlas_core import LLM, SamplingParams

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

def run(llm):  # one short generation reads every weight
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))

SETTINGS = dict(kv_cache_memory_gib=1 / 256, max_seq_len=64, gguf_weights="quantized")  # GGUF: kept in blocks
run(LLM(sys.argv[2], **SETTINGS))  # imports and first-use costs
gc.collect()
before = rss()
llm = LLM(sys.argv[1], **SETTINGS)
loaded = rss()
run(llm)
try:  # hand the freed dequantization buffers back: glibc keeps freed blocks of their size in its heap
    ctypes.CDLL("libc.so.6").malloc_trim(0)
except (OSError, AttributeError):
    pass
print(loaded - before, rss() - before)
"""


def assert_grows_by_about_the_file_size(model: Path, warm_up: Path, file_bytes: int, what: str) -> None:
    """Load ``model`` (after ``warm_up``, a small model of the same kind that pays the imports and
    first-use costs) in a fresh process: loading it, and running it, must each grow the process by at
    most ``file_bytes`` + `RSS_SLACK_BYTES`; ``what`` names the model in the failure message."""
    probe = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(model), str(warm_up)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded, ran = (int(value) for value in probe.stdout.split()[-2:])
    print(
        f"file {file_bytes / 2**20:.1f} MiB; resident growth {loaded / 2**20:.1f} MiB loaded, {ran / 2**20:.1f} MiB run"
    )
    for step, growth in (("loading", loaded), ("loading and running", ran)):
        assert growth <= file_bytes + RSS_SLACK_BYTES, (
            f"{step} a {file_bytes / 2**20:.1f} MiB {what} grew the process by {growth / 2**20:.1f} MiB"
        )
