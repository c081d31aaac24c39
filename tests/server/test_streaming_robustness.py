"""Disconnects free KV blocks, 32 concurrent streams match each request alone, graceful shutdown ends
streams cleanly, and the request timeout ends requests that run too long."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

LONG = "word " * 400
ASK = [{"role": "user", "content": "[long]"}]


def wait_until_idle(server: LiveServer, free_blocks: int, timeout: float = 3.0) -> None:
    """Wait for no requests and ``free_blocks`` free blocks; far sooner than the scripted requests here would
    finish by themselves (400 tokens at 20 ms a step), so passing means they were aborted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.engine.requests and server.engine.blocks.num_free_blocks == free_blocks:
            return
        time.sleep(0.02)
    raise AssertionError(
        f"engine not idle: {len(server.engine.requests)} requests, "
        f"{server.engine.blocks.num_free_blocks} free blocks (expected {free_blocks})"
    )


def read_events_then_disconnect(url: str, body: dict, events: int) -> list[str]:
    seen: list[str] = []
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen.append(line)
            if len(seen) == events:
                break
    return seen  # leaving the block closes the connection mid-stream


def test_disconnect_aborts_and_frees_blocks(scripted: ScriptedFactory) -> None:
    server = scripted({"[long]": LONG}, delay_s=0.02)
    start = server.engine.blocks.num_free_blocks
    chat = read_events_then_disconnect(server.url + "/v1/chat/completions", {"messages": ASK, "stream": True}, 4)
    assert len(chat) == 4
    wait_until_idle(server, start)
    message = read_events_then_disconnect(
        server.url + "/v1/messages", {"model": "scripted", "max_tokens": 900, "messages": ASK, "stream": True}, 5
    )
    assert len(message) == 5
    wait_until_idle(server, start)
    completions = read_events_then_disconnect(
        server.url + "/v1/completions",
        {"prompt": ["[long] a", "[long] b"], "stream": True, "max_tokens": 500, "ignore_eos": True},
        3,
    )
    assert len(completions) == 3
    wait_until_idle(server, start)


def test_32_concurrent_streams_match_each_request_alone(smol: LiveServer) -> None:
    prompts = [f"Write one sentence about the number {i}." for i in range(8)]

    async def stream(sdk: openai.AsyncOpenAI, prompt: str) -> str:
        chunks = await sdk.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=10, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    async def run() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(base_url=smol.url + "/v1", api_key="x", max_retries=0, timeout=300) as sdk:
            alone = [await stream(sdk, prompt) for prompt in prompts]
            together = await asyncio.gather(*(stream(sdk, prompts[i % 8]) for i in range(32)))
        return alone, list(together)

    start = smol.engine.blocks.num_free_blocks
    alone, together = asyncio.run(run())
    assert all(alone)
    assert together == [alone[i % 8] for i in range(32)]
    wait_until_idle(smol, start)


def test_graceful_shutdown_finishes_short_requests_and_ends_long_ones(scripted: ScriptedFactory) -> None:
    server = scripted({"[long]": LONG, "[short]": "a b c d e f g h"}, delay_s=0.02, shutdown_timeout=0.5)
    results: dict[str, list[str]] = {}

    def consume(name: str, content: str) -> None:
        body = {"messages": [{"role": "user", "content": content}], "stream": True}
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", server.url + "/v1/chat/completions", json=body) as response,
        ):
            results[name] = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]

    threads = [threading.Thread(target=consume, args=args) for args in (("long", "[long]"), ("short", "[short]"))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(server.engine.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.stop()
    for thread in threads:
        thread.join(timeout=30)
    short = [json.loads(line) for line in results["short"][:-1]]
    assert results["short"][-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in short) == "a b c d e f g h"
    assert short[-1]["choices"][0]["finish_reason"] == "stop"
    assert results["long"][-1] == "[DONE]"
    error = json.loads(results["long"][-2])["error"]
    assert "shutting down" in error["message"] and error["type"] == "service_unavailable"
    assert not server.engine.requests and server.engine.blocks.num_free_blocks == server.engine.blocks.num_blocks


def test_request_timeout(scripted: ScriptedFactory) -> None:
    server = scripted({"[long]": LONG}, delay_s=0.02, request_timeout=0.3)
    start = server.engine.blocks.num_free_blocks
    response = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK}, timeout=30)
    assert response.status_code == 504 and "--request-timeout" in response.json()["error"]["message"]
    streamed = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "stream": True}, timeout=30)
    lines = [line[len("data: ") :] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]" and json.loads(lines[-2])["error"]["type"] == "timeout_error"
    wait_until_idle(server, start)


def test_requests_arriving_during_the_drain_get_503(scripted: ScriptedFactory) -> None:
    server = scripted({"[long]": LONG}, delay_s=0.02, shutdown_timeout=3)
    ended: dict[str, list[str]] = {}

    def consume() -> None:
        body = {"messages": ASK, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as response:
            ended["long"] = [line for line in response.iter_lines() if line.startswith("data: ")]

    stream = threading.Thread(target=consume)
    stream.start()
    deadline = time.monotonic() + 10
    while not server.engine.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    server.server.should_exit = True  # what SIGTERM does
    while not server.state.shutting_down and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK}, timeout=10)
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 503 and health.json() == {"status": "shutting_down"}
    stream.join(timeout=30)
    server.stop()
    assert ended["long"][-1] == "data: [DONE]" and "shutting down" in ended["long"][-2]
