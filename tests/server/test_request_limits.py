"""One request cannot hold the server: its work is bounded (over-limit requests get a 400 at once),
the event loop keeps answering while the engine is busy, and a client that goes away ends its request."""

from __future__ import annotations

import threading
import time

import httpx

from tests.server.conftest import ScriptedFactory


def test_health_answers_while_a_request_of_thousands_of_sequences_is_queued(scripted: ScriptedFactory) -> None:
    server = scripted({}, max_seq_len=256)
    body = {"prompt": [f"prompt {i}" for i in range(20)], "n": 128, "max_tokens": 1}
    result: dict[str, httpx.Response] = {}
    large = threading.Thread(target=lambda: result.update(response=httpx.post(server.url + "/v1/completions", json=body, timeout=120)))
    large.start()
    slowest = 0.0
    with httpx.Client(base_url=server.url, timeout=60) as client:
        while large.is_alive():
            start = time.monotonic()
            assert client.get("/health").status_code == 200
            slowest = max(slowest, time.monotonic() - start)
            time.sleep(0.02)
    assert result["response"].status_code == 200 and len(result["response"].json()["choices"]) == 20 * 128
    assert slowest < 1.0, f"/health took {slowest:.2f} s while the request's sequences were queued"
