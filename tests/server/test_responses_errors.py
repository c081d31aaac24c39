"""Bad ``/v1/responses`` requests get a 4xx whose message and ``param`` name the field, never a 5xx."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer
from tests.server.test_responses_api import SCRIPTS, WEATHER


@pytest.fixture(scope="module")
def server(scripted: ScriptedFactory) -> LiveServer:
    return scripted(SCRIPTS, tool_call_parser="hermes", max_seq_len=256)


@pytest.fixture(scope="module")
def no_parser(scripted: ScriptedFactory) -> LiveServer:
    return scripted(SCRIPTS)


CASES: list[tuple[str, dict[str, Any], int, str | None, str]] = [
    (
        "unknown previous_response_id",
        {"input": "hi", "previous_response_id": "resp_nope"},
        404,
        "previous_response_id",
        "resp_nope",
    ),
    ("input of the wrong type", {"input": 12}, 400, "input", "input"),
    ("no input", {}, 400, "input", "input"),
    ("empty input list", {"input": []}, 400, "input", "input"),
    ("only instructions", {"instructions": "be brief"}, 400, "input", "input"),
    (
        "unknown item type",
        {"input": [{"type": "web_search_call", "id": "ws_1"}]},
        400,
        "input[0].type",
        "web_search_call",
    ),
    ("unknown role", {"input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role", "robot"),
    (
        "image content",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input[0].content[0]",
        "text only",
    ),
    (
        "function_call_output without call_id",
        {"input": [{"type": "function_call_output", "output": "x"}]},
        400,
        "input[0].call_id",
        "call_id",
    ),
    (
        "function_call with object arguments",
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
        400,
        "input[0].arguments",
        "JSON text",
    ),
    ("hosted tool", {"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type", "web_search"),
    ("function tool without name", {"input": "hi", "tools": [{"type": "function"}]}, 400, "tools[0].name", "name"),
    ("tool_choice required without tools", {"input": "hi", "tool_choice": "required"}, 400, "tool_choice", "required"),
    (
        "tool_choice naming an unknown tool",
        {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
        400,
        "tool_choice",
        "nope",
    ),
    ("max_output_tokens 0", {"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens", "at least 1"),
    (
        "max_output_tokens beyond the context",
        {"input": "hi", "max_output_tokens": 100000},
        400,
        "max_output_tokens",
        "max_seq_len",
    ),
    ("prompt too long", {"input": "word " * 400}, 400, "input", "prompt too long"),
    (
        "text.format json_schema without schema",
        {"input": "hi", "text": {"format": {"type": "json_schema"}}},
        400,
        "text.format",
        "schema",
    ),
    (
        "invalid schema",
        {"input": "hi", "text": {"format": {"type": "json_schema", "schema": {"type": 12}}}},
        400,
        None,
        "schema",
    ),
    ("unknown model", {"input": "hi", "model": "gpt-9"}, 404, "model", "gpt-9"),
]


@pytest.mark.parametrize(("name", "body", "status", "param", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_request(
    server: LiveServer, name: str, body: dict[str, Any], status: int, param: str | None, words: str
) -> None:
    response = httpx.post(server.url + "/v1/responses", json={"model": "scripted", **body}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"]
    if param is not None:
        assert error["param"] == param


def test_tools_need_a_parser(no_parser: LiveServer) -> None:
    response = httpx.post(no_parser.url + "/v1/responses", json={"input": "[weather]", "tools": [WEATHER]}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"
    assert "--tool-call-parser" in response.json()["error"]["message"]


def test_unknown_ids_on_retrieve_and_delete(server: LiveServer) -> None:
    for method in ("GET", "DELETE"):
        response = httpx.request(method, server.url + "/v1/responses/resp_missing", timeout=30)
        assert response.status_code == 404 and "resp_missing" in response.json()["error"]["message"]
