"""Memory stays flat under sustained load: the KV cache is resident from the start (not committed
block by block as requests use it), and no per-request state outlives its request."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.sequence import Request, Sequence
from atlas_core.server.metrics import RequestTracker
from atlas_core.server.output_parsing import CompletionParser
from tests.server.conftest import ScriptedFactory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")

PER_REQUEST = (Request, Sequence, RequestOutput, RequestTracker, CompletionParser)
"""Objects that exist once per request (or per completion) while it runs, and never after."""


def rss_mib() -> float:
    """Resident memory of this process (the test and the server in its threads)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def live(types: tuple[type, ...]) -> Counter[str]:
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects() if isinstance(o, types))


RESIDENT_PROBE = """
from pathlib import Path
import numpy as np
from atlas_core.backends.numpy_backend import NumpyBackend

def rss_mib():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

before = rss_mib()
cache = NumpyBackend().zeros((32 * 2**20,), np.float32)  # 128 MiB, as a KV cache array is allocated
print(rss_mib() - before)
"""


def test_kv_cache_memory_is_resident_when_allocated() -> None:
    """Measured in a fresh process: in a long test process the allocator may hand back pages that are
    already resident, which would hide memory committed page by page."""
    probe = subprocess.run([sys.executable, "-c", RESIDENT_PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert float(probe.stdout) > 120, "zeros left the memory to be committed page by page as it gets written"


def request_mix(client: httpx.Client, i: int) -> None:
    """One of six request shapes, each with text of its own (so prompts and schemas never repeat)."""
    ask = [{"role": "user", "content": f"[ask] {i}"}]
    bodies = [
        ("/v1/chat/completions", {"messages": ask}),
        ("/v1/chat/completions", {"messages": ask, "stream": True, "logprobs": True, "top_logprobs": 3}),
        ("/v1/completions", {"prompt": [f"hello {i}", "x"], "max_tokens": 4, "logprobs": 2, "echo": True}),
        ("/v1/messages", {"model": "scripted", "max_tokens": 30, "messages": ask}),
        (
            "/v1/chat/completions",
            {
                "messages": ask,
                "max_tokens": 8,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {f"k{i}": {"type": "string"}}},
                    },
                },
            },
        ),
        ("/v1/chat/completions", {"messages": ask, "n": 3, "seed": i}),
    ]
    path, body = bodies[i % len(bodies)]
    assert client.post(path, json=body).status_code == 200


def test_memory_is_flat_after_warm_up(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "fine, thanks"}, max_seq_len=256)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(60):
            request_mix(client, i)
        objects, rss = live(PER_REQUEST), rss_mib()
        for i in range(60, 300):
            request_mix(client, i)
        grown = rss_mib() - rss
        after = live(PER_REQUEST)
    assert not server.engine.requests and not server.state.runtime.engine._queues  # type: ignore[union-attr]
    assert not server.engine.guided.active
    outlived = {name: count for name, count in after.items() if count > objects[name]}
    assert not outlived, f"per-request objects outlived their requests: {after} (after warm-up: {objects})"
    assert grown < 8, f"resident memory grew by {grown:.1f} MiB over 240 requests after warm-up"
