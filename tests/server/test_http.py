"""Auth, CORS, health while loading, metrics, the OpenAPI document, and the tokenizer endpoints."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from atlas_core.server.state import ServerConfig, ServerState
from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

ASK = [{"role": "user", "content": "[ask]"}]
KEYS = ["first-key-0123456789", "second-key-abcdefghi"]


@pytest.fixture(scope="module")
def locked(scripted: ScriptedFactory) -> LiveServer:
    return scripted({"[ask]": "hello there"}, api_keys=KEYS, cors_allow_origins=["https://chat.example"])


def test_auth_required_on_model_routes(locked: LiveServer) -> None:
    for method, path in [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    ]:
        response = httpx.request(method, locked.url + path, json={})
        assert response.status_code == 401, path
        assert "missing API key" in (response.json().get("error") or {}).get("message", ""), path
    wrong = httpx.post(
        locked.url + "/v1/chat/completions",
        json={"messages": ASK},
        headers={"Authorization": "Bearer first-key-0123456788"},
    )
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    anthropic_shaped = httpx.post(locked.url + "/v1/messages", json={}, headers={"x-api-key": "nope"})
    assert anthropic_shaped.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }


def test_health_and_metrics_stay_open(locked: LiveServer) -> None:
    assert httpx.get(locked.url + "/health").json() == {"status": "ok"}
    assert httpx.get(locked.url + "/metrics").status_code == 200


def test_sdks_authenticate_with_either_key(locked: LiveServer) -> None:
    for key in KEYS:
        chat = locked.openai(key).chat.completions.create(model="scripted", messages=ASK)
        assert chat.choices[0].message.content == "hello there"
        message = locked.anthropic(key).messages.create(model="scripted", max_tokens=20, messages=ASK)
        assert message.content[0].text == "hello there"
    with pytest.raises(openai.AuthenticationError):
        locked.openai("bad").models.list()
    with pytest.raises(anthropic.AuthenticationError):
        locked.anthropic("bad").messages.create(model="scripted", max_tokens=5, messages=ASK)


def test_cors(locked: LiveServer, scripted: ScriptedFactory) -> None:
    preflight = httpx.options(
        locked.url + "/v1/chat/completions",
        headers={
            "Origin": "https://chat.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code in (200, 204)
    assert preflight.headers["access-control-allow-origin"] == "https://chat.example"
    other = httpx.get(locked.url + "/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    plain = scripted({"[ask]": "x"})
    assert (
        "access-control-allow-origin"
        not in httpx.get(plain.url + "/health", headers={"Origin": "https://chat.example"}).headers
    )


def test_loading_state_answers_503() -> None:
    loading = LiveServer(ServerState(ServerConfig()))
    try:
        health = httpx.get(loading.url + "/health")
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        chat = httpx.post(loading.url + "/v1/chat/completions", json={"messages": ASK})
        assert chat.status_code == 503 and "still loading" in chat.json()["error"]["message"]
        assert httpx.get(loading.url + "/v1/models").status_code == 503
        messages = httpx.post(loading.url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": ASK})
        assert messages.status_code == 503 and messages.json()["error"]["type"] == "overloaded_error"
    finally:
        loading.stop()


def test_metrics(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "one two three four five"})
    sdk = server.openai("x")
    long_ask = [{"role": "user", "content": "[ask] " + "lorem ipsum " * 30}]  # several full KV blocks
    for _ in range(2):
        list(sdk.chat.completions.create(model="scripted", messages=long_ask, stream=True))
    httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
    text = httpx.get(server.url + "/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")
    }
    chat = 'atlas_http_requests_total{method="POST",model_name="scripted",route="/v1/chat/completions",status="%s"}'
    assert samples[chat % 200] == 2
    assert samples[chat % 400] == 1
    assert samples['atlas_time_to_first_token_seconds_count{model_name="scripted"}'] == 2
    generated = samples['atlas_generation_tokens_total{model_name="scripted"}']
    assert generated == 2 * (
        len(server.state.runtime.tokenizer.encode("one two three four five", add_special_tokens=False)) + 1
    )
    assert samples['atlas_inter_token_latency_seconds_count{model_name="scripted"}'] == generated - 2
    assert samples['atlas_requests_finished_total{finish_reason="stop",model_name="scripted"}'] == 2
    assert samples['atlas_prompt_tokens_total{model_name="scripted"}'] > 0
    for name in (
        "atlas_num_sequences_running",
        "atlas_num_sequences_waiting",
        "atlas_kv_cache_usage_ratio",
        "atlas_prefix_cache_hit_rate",
    ):
        assert f'{name}{{model_name="scripted"}}' in samples
    assert samples['atlas_prefix_cache_hit_rate{model_name="scripted"}'] > 0  # the second request reused the prompt
    assert samples['atlas_num_sequences_running{model_name="scripted"}'] == 0


def test_openapi_document(locked: LiveServer) -> None:
    document = httpx.get(locked.url + "/openapi.json").json()
    assert document["openapi"].startswith("3.")
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
    ):
        assert path in document["paths"], path
    schemas = document["components"]["schemas"]
    for name in ("ChatCompletionRequest", "ChatCompletion", "CompletionRequest", "MessagesRequest", "MessageResponse"):
        assert name in schemas, name


def test_tokenize_and_detokenize(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "x"})
    tokenized = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == 1024
    assert httpx.post(server.url + "/detokenize", json={"tokens": tokenized["tokens"]}).json() == {
        "prompt": "Hello world"
    }
    chat = httpx.post(server.url + "/tokenize", json={"messages": ASK}).json()
    usage = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK}).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]
