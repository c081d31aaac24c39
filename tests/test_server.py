"""The HTTP server on the default model, through Litestar's test client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from atlas_core.engine.async_engine import AsyncEngine
from atlas_core.server.app import create_app


@pytest.fixture(scope="module")
def client(default_llm: object) -> Iterator[TestClient]:
    app = create_app(AsyncEngine(default_llm.engine), default_llm.require_tokenizer(), "smollm2")
    with TestClient(app) as test_client:
        yield test_client


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_completion(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "max_tokens": 24})
    assert response.status_code == 201 or response.status_code == 200
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] > 0


def test_chat_completion_stream(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "stream": True})
    events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(chunk["choices"][0]["delta"]["content"] for chunk in chunks)
    assert "Paris" in text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completion_with_stop(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": "1, 2, 3, 4,", "temperature": 0, "max_tokens": 20, "stop": ["7"]})
    body = response.json()
    assert "7" not in body["choices"][0]["text"]
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "payload",
    [
        {"messages": QUESTION, "temperature": -2},
        {"messages": QUESTION, "top_p": 7},
        {"messages": "not a list"},
        {"nothing": True},
    ],
)
def test_bad_requests_are_4xx_with_a_message(client: TestClient, payload: dict) -> None:
    response = client.post("/v1/chat/completions", json=payload)
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["message"]


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400


def test_models_and_health(client: TestClient) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "smollm2"
    assert client.get("/health").json() == {"status": "ok"}
    # the server still answers after the bad requests above
    response = client.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "max_tokens": 4})
    assert response.json()["choices"][0]["message"]["content"]
