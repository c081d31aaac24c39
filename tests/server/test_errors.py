"""Bad requests get 4xx errors in the API's own shape that say what is wrong; the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

ASK = [{"role": "user", "content": "[ask]"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def server(scripted: ScriptedFactory) -> LiveServer:
    return scripted({"[ask]": "fine"}, max_seq_len=256, max_body_bytes=100_000)


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def DEEP_SCHEMA(levels: int) -> bytes:  # noqa: N802 (reads as a constant in the case table)
    """A JSON Schema of objects nested ``levels`` deep, as JSON text (too deep for `json.dumps`)."""
    return b'{"type": "object", "properties": {"a": ' * levels + b'{"type": "string"}' + b"}}" * levels


SCHEMA_REQUEST = (
    b'{"messages": [{"role": "user", "content": "[ask]"}], '
    b'"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": %s}}}'
)


SELF_REFERENCE = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}

CHAT_CASES: list[tuple[str, Any, str, str | None]] = [
    ("malformed JSON", b'{"messages": [', "not valid JSON", None),
    (  # refused by name before the chat template sees list content
        "image on a text-only model",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
        "image content is not supported: the served model reads text only",
        None,
    ),
    (  # the grammar gives up on this schema during generation: the request's fault, a 400 and not a 500
        "self-referencing schema",
        {
            "messages": ASK,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF_REFERENCE}},
        },
        "simplify the requested output format",
        None,
    ),
    ("not an object", b"[1, 2]", "Expected `object`", None),
    ("messages wrong type", {"messages": "hello"}, "`messages`: Expected `array`", "messages"),
    ("temperature wrong type", {"messages": ASK, "temperature": "hot"}, "`temperature`", "temperature"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, "`messages[0].role`", "messages[0].role"),
    ("empty messages", {"messages": []}, "messages must not be empty", "messages"),
    ("negative max_tokens", {"messages": ASK, "max_tokens": -5}, "max_tokens must be at least 1, got -5", "max_tokens"),
    (
        "zero max_completion_tokens",
        {"messages": ASK, "max_completion_tokens": 0},
        "at least 1",
        "max_completion_tokens",
    ),
    (
        "absurd max_tokens",
        {"messages": ASK, "max_tokens": 10**12},
        "is more than the model's context (max_seq_len 256)",
        "max_tokens",
    ),
    ("prompt too long", {"messages": [{"role": "user", "content": "word " * 400}]}, "prompt too long: ", "messages"),
    ("temperature out of range", {"messages": ASK, "temperature": -1}, "temperature must be in [0, 100]", None),
    ("top_p out of range", {"messages": ASK, "top_p": 7}, "top_p must be in (0, 1]", None),
    ("n out of range", {"messages": ASK, "n": 0}, "n must be between 1 and", None),
    ("top_logprobs alone", {"messages": ASK, "top_logprobs": 3}, "top_logprobs needs logprobs: true", "top_logprobs"),
    (
        "too many logprobs",
        {"messages": ASK, "logprobs": True, "top_logprobs": 50},
        "logprobs must be between 0 and 20",
        None,
    ),
    ("logit_bias key", {"messages": ASK, "logit_bias": {"abc": 1}}, "logit_bias keys must be token ids", "logit_bias"),
    (
        "unknown response_format",
        {"messages": ASK, "response_format": {"type": "yaml"}},
        "`response_format.type`",
        "response_format.type",
    ),
    (
        "invalid json_schema",
        {
            "messages": ASK,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}},
        },
        "not a valid JSON Schema",
        None,
    ),
    (
        "json_schema without schema",
        {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "needs",
        None,
    ),
    (
        "image content",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
        "image content is not supported",
        None,
    ),
    ("tools without a parser", {"messages": ASK, "tools": TOOLS}, "no tool-call parser", "tools"),
    ("required without tools", {"messages": ASK, "tool_choice": "required"}, "needs at least one tool", "tool_choice"),
    ("stop token out of vocab", {"messages": ASK, "stop_token_ids": [10**9]}, "outside [0,", None),
    ("absurd top_k", {"messages": ASK, "top_k": 10**18}, "top_k=1000000000000000000 is more than the vocabulary", None),
    ("lone surrogate", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "not valid JSON", None),
    ("500-deep schema", SCHEMA_REQUEST % DEEP_SCHEMA(500), "nested too deeply", None),
    ("150-deep schema", SCHEMA_REQUEST % DEEP_SCHEMA(150), "nested too deeply", None),
    *[
        (
            f"chat_template_kwargs {key}",
            {"messages": ASK, "chat_template_kwargs": {key: value}},
            f"chat_template_kwargs must not set {key}",
            None,
        )
        for key, value in [("add_generation_prompt", True), ("tools", []), ("messages", ASK)]
    ],
    (
        "continue_final_message with add_generation_prompt",
        {"messages": [*ASK, {"role": "assistant", "content": "Sure"}], "continue_final_message": True},
        "continue_final_message and add_generation_prompt cannot both be true",
        None,
    ),
    (
        "tool message without id",
        {"messages": [{"role": "tool", "content": "x"}]},
        "a tool message needs tool_call_id",
        None,
    ),
]


@pytest.mark.parametrize(("body", "words", "param"), [c[1:] for c in CHAT_CASES], ids=[c[0] for c in CHAT_CASES])
def test_chat_errors(http: httpx.Client, body: Any, words: str, param: str | None) -> None:
    if isinstance(body, bytes):
        response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    else:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def test_unknown_model_is_404_in_each_shape(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": ASK})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found" and "gpt-9" in response.json()["error"]["message"]
    response = http.post("/v1/messages", json={"model": "claude-9", "max_tokens": 5, "messages": ASK})
    assert response.status_code == 404
    assert response.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": response.json()["error"]["message"]},
    }


ANTHROPIC_CASES: list[tuple[str, Any, str]] = [
    ("malformed JSON", b"{", "not valid JSON"),
    ("missing max_tokens", {"model": "scripted", "messages": ASK}, "max_tokens"),
    ("negative max_tokens", {"model": "scripted", "max_tokens": -1, "messages": ASK}, "max_tokens must be at least 1"),
    ("empty messages", {"model": "scripted", "max_tokens": 5, "messages": []}, "messages must not be empty"),
    (
        "unknown block",
        {"model": "scripted", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "`messages[0].content",
    ),
    (
        "image block",
        {
            "model": "scripted",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        },
        "image content is not supported: the served model reads text only",
    ),
    (
        "prompt too long",
        {"model": "scripted", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 400}]},
        "prompt too long",
    ),
    (
        "server tool",
        {
            "model": "scripted",
            "max_tokens": 5,
            "messages": ASK,
            "tools": [{"name": "web_search", "type": "web_search_20250305"}],
        },
        "server tools are not supported",
    ),
]


@pytest.mark.parametrize(("body", "words"), [c[1:] for c in ANTHROPIC_CASES], ids=[c[0] for c in ANTHROPIC_CASES])
def test_messages_errors_are_anthropic_shaped(http: httpx.Client, body: Any, words: str) -> None:
    if isinstance(body, bytes):
        response = http.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    else:
        response = http.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert words in payload["error"]["message"]


def test_sdks_raise_bad_request(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError, match="prompt too long"):
        server.openai("x").chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "word " * 400}]
        )
    with pytest.raises(anthropic.BadRequestError, match="messages must not be empty"):
        server.anthropic("x").messages.create(model="scripted", max_tokens=5, messages=[])


def test_http_level_errors(http: httpx.Client) -> None:
    missing = http.get("/v1/nothing-here")
    assert missing.status_code == 404 and "not found" in missing.json()["error"]["message"]
    wrong_method = http.get("/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]
    huge = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 200_000}]})
    assert huge.status_code == 413 and "--max-body-bytes" in huge.json()["error"]["message"]
    too_big_messages = http.post(
        "/v1/messages", content=b"{" + b" " * 200_000 + b"}", headers={"content-type": "application/json"}
    )
    assert too_big_messages.status_code == 413 and too_big_messages.json()["error"]["type"] == "request_too_large"


def test_completions_and_tokenizer_errors(http: httpx.Client) -> None:
    cases = [
        ("/v1/completions", {"prompt": []}, "prompt must be"),
        ("/v1/completions", {"prompt": ["a", 1]}, "not mixed"),
        ("/v1/completions", {"prompt": [-4]}, "prompt token ids [-4] are outside the vocabulary"),
        ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix is not supported"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens must be at least 1"),
        ("/tokenize", {}, "exactly one of prompt and messages"),
        ("/detokenize", {"tokens": [-1]}, "outside the vocabulary"),
    ]
    for path, body, words in cases:
        response = http.post(path, json=body)
        assert response.status_code == 400, (path, body, response.text)
        assert words in response.json()["error"]["message"], (path, body)


POST_ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
]


@pytest.mark.parametrize("path", POST_ROUTES)
def test_undecodable_bodies_are_400_on_every_route(http: httpx.Client, path: str) -> None:
    bodies = [
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}], "prompt": "\xff"}', "not valid Unicode"),
        (b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
        (b'{"prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "nested too deeply"),
        (b"", "the request body is empty: send a JSON object"),
    ]
    for body, words in bodies:
        response = http.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, (body[:20], response.text)
        assert words in response.text


def test_continue_final_message_leaves_the_last_message_open(http: httpx.Client) -> None:
    messages = [*ASK, {"role": "assistant", "content": "The answer is"}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    tokens = http.post("/tokenize", json=body).json()["tokens"]
    text = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert text.endswith("assistant\nThe answer is")


def test_still_serving_after_all_that(server: LiveServer, http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"messages": ASK, "temperature": 0})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "fine"
    assert not server.engine.requests


def test_a_client_gone_while_sending_its_body_is_recorded_as_499() -> None:
    """Litestar reports a body cut short by a disconnect as a server exception; it is the client's doing."""
    from litestar.exceptions import InternalServerException

    from atlas_core.server.errors import CLIENT_CLOSED, as_api_error

    error = as_api_error(InternalServerException("client disconnected prematurely"))
    assert error.status == CLIENT_CLOSED == 499 and "before it had sent the request body" in error.message
