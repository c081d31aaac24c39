"""One request cannot hold the server: its work is bounded (over-limit requests get a 400 at once),
the event loop keeps answering while the engine is busy, and a client that goes away ends its request
whether or not it streams."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from atlas_core.errors import ConfigError
from atlas_core.server.state import ServerConfig
from tests.server.conftest import ScriptedFactory
from tests.server.test_streaming_robustness import LONG, wait_until_idle

ASK = [{"role": "user", "content": "[long]"}]


def test_health_answers_while_a_request_of_thousands_of_sequences_is_queued(scripted: ScriptedFactory) -> None:
    server = scripted({}, max_seq_len=256, max_sequences_per_request=4096)
    body = {"prompt": [f"prompt {i}" for i in range(20)], "n": 128, "max_tokens": 1}
    result: dict[str, httpx.Response] = {}

    def post() -> None:
        result["response"] = httpx.post(server.url + "/v1/completions", json=body, timeout=120)

    large = threading.Thread(target=post)
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


OVER_LIMIT = [
    ("/v1/completions", {"prompt": [f"p{i}" for i in range(200)], "n": 128}, "25600 completions", "--max-sequences"),
    ("/v1/chat/completions", {"messages": ASK, "n": 40}, "40 completions", "--max-sequences-per-request"),
    ("/v1/chat/completions", {"messages": ASK, "n": 8}, "may create up to", "--max-tokens-per-request"),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 4, "max_tokens": 50}, "may create up to", "--max-tokens"),
    ("/v1/messages", {"model": "scripted", "max_tokens": 5000, "messages": ASK}, "may create up to", "--max-tokens"),
    ("/v1/chat/completions", {"messages": ASK, "min_tokens": 10**9}, "min_tokens=1000000000 is more than", "at most"),
    ("/v1/completions", {"prompt": "a", "min_tokens": 256, "max_tokens": 256}, "min_tokens=256 is more", "at most"),
]


@pytest.mark.parametrize(("path", "body", "what", "change"), OVER_LIMIT, ids=[f"{c[0]} {c[2]}" for c in OVER_LIMIT])
def test_over_limit_requests_get_a_400_at_once(
    scripted: ScriptedFactory, path: str, body: dict, what: str, change: str
) -> None:
    tokens = 200 if path == "/v1/messages" else 300  # a Messages request is one completion of at most 256 tokens
    server = scripted({"[long]": LONG}, max_seq_len=256, max_sequences_per_request=32, max_tokens_per_request=tokens)
    start = time.monotonic()
    response = httpx.post(server.url + path, json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert time.monotonic() - start < 1.0
    message = response.json()["error"]["message"]
    assert what in message and change in message
    assert not server.engine.requests


FLOOD = "a " * 2_000_000  # 4 MB of text: tokenizing it would hold the server for seconds


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": FLOOD}, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": FLOOD}]}]},
            "messages",
        ),
        (
            "/v1/messages",
            {"model": "scripted", "max_tokens": 4, "messages": [{"role": "user", "content": FLOOD}]},
            None,
        ),
        ("/v1/embeddings", {"input": [FLOOD]}, "input"),
    ],
    ids=["completions", "chat", "messages", "embeddings"],
)
def test_a_flood_of_text_is_refused_before_it_is_tokenized(
    scripted: ScriptedFactory, path: str, body: dict, param: str | None
) -> None:
    """A prompt with more characters than the context's tokens could hold gets its 400 at once, while /health
    keeps answering: the text is never handed to the tokenizer."""
    server = scripted({}, max_seq_len=256)
    start = time.monotonic()
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert time.monotonic() - start < 2.0
    error = response.json()["error"]
    assert re.search(r"prompt too long: its 400000\d characters cannot fit", error["message"]), error["message"]
    assert "--max-seq-len" in error["message"]
    if param is not None:
        assert error["param"] == param
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": ASK, "min_tokens": 200}),
        ("/v1/completions", {"prompt": ["[long] a", "[long] b"], "max_tokens": 900, "ignore_eos": True}),
        ("/v1/messages", {"model": "scripted", "max_tokens": 900, "messages": ASK}),
    ],
    ids=["chat", "completions", "messages"],
)
def test_a_client_that_goes_away_ends_its_non_streamed_request(
    scripted: ScriptedFactory, path: str, body: dict
) -> None:
    server = scripted({"[long]": LONG}, delay_s=0.02)
    free = server.engine.blocks.num_free_blocks
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + path, json=body, timeout=httpx.Timeout(30, read=0.5))
    wait_until_idle(server, free)


def test_limits_below_one_are_refused_at_startup() -> None:
    with pytest.raises(ConfigError, match="max_tokens_per_request must be at least 1"):
        ServerConfig(max_tokens_per_request=0)
