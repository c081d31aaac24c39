"""The raw HTTP wire format (no SDK in between) on the default model: status codes, JSON bodies and
the SSE framing."""

from __future__ import annotations

import json

import httpx

from tests.server.live import LiveServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def sse_data(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_chat_completion_json(smol: LiveServer) -> None:
    response = httpx.post(
        smol.url + "/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "max_tokens": 24}, timeout=60
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "The capital of France is Paris."}
    assert body["choices"][0]["logprobs"] is None


def test_chat_stream_framing(smol: LiveServer) -> None:
    response = httpx.post(
        smol.url + "/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "stream": True}, timeout=60
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_data(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"} and len(
        {chunk["id"] for chunk in chunks}
    ) == 1
    assert (
        "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
        == "The capital of France is Paris."
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completion_with_stop(smol: LiveServer) -> None:
    body = {"prompt": "1, 2, 3, 4,", "temperature": 0, "max_tokens": 20, "stop": ["7"]}
    response = httpx.post(smol.url + "/v1/completions", json=body, timeout=60).json()
    assert response["choices"][0]["text"] == " 5, 6, "
    assert response["choices"][0]["finish_reason"] == "stop"


def test_messages_stream_framing(smol: LiveServer) -> None:
    body = {"model": "smollm2", "max_tokens": 3, "messages": QUESTION, "stream": True}
    response = httpx.post(smol.url + "/v1/messages", json=body, timeout=60)
    lines = [line for line in response.text.splitlines() if line]
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    payloads = [json.loads(data) for data in sse_data(response.text)]
    assert names == [payload["type"] for payload in payloads]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert payloads[-2]["delta"]["stop_reason"] == "max_tokens" and payloads[-2]["usage"]["output_tokens"] == 3
