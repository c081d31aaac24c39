"""The official ``openai`` SDK against live servers: chat, completions, logprobs, models."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_completion(smol: LiveServer) -> None:
    response = smol.openai().chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    choice = response.choices[0]
    assert choice.message.content == "The capital of France is Paris."
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert (
        response.usage.completion_tokens
        == len(smol.engine.loaded.tokenizer.encode(choice.message.content, add_special_tokens=False)) + 1
    )
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_chat_stream_matches_non_stream_and_reports_usage(smol: LiveServer) -> None:
    stream = smol.openai().chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_chat_n_seed_stop_and_max_completion_tokens(smol: LiveServer) -> None:
    sdk = smol.openai()
    sampled = sdk.chat.completions.create(
        model="smollm2", messages=QUESTION, n=3, temperature=1.0, seed=7, max_completion_tokens=8
    )
    again = sdk.chat.completions.create(
        model="smollm2", messages=QUESTION, n=3, temperature=1.0, seed=7, max_completion_tokens=8
    )
    assert [c.index for c in sampled.choices] == [0, 1, 2]
    assert [c.message.content for c in sampled.choices] == [c.message.content for c in again.choices]
    assert all(c.finish_reason in ("stop", "length") for c in sampled.choices)
    assert sampled.usage.completion_tokens <= 3 * 8
    stopped = sdk.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24, stop=["France"]
    )
    assert stopped.choices[0].message.content == "The capital of "
    assert stopped.choices[0].finish_reason == "stop"


def test_chat_logprobs(smol: LiveServer) -> None:
    response = smol.openai().chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = response.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == response.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the most likely
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token


def test_completions_with_logprobs_and_echo(smol: LiveServer) -> None:
    sdk = smol.openai()
    response = sdk.completions.create(model="smollm2", prompt="1, 2, 3, 4,", temperature=0, max_tokens=6, logprobs=2)
    choice = response.choices[0]
    assert choice.text.startswith(" 5, 6")
    assert "".join(choice.logprobs.tokens) == choice.text
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    assert choice.logprobs.text_offset[0] == 0
    echoed = sdk.completions.create(
        model="smollm2", prompt="1, 2, 3, 4,", temperature=0, max_tokens=6, logprobs=1, echo=True
    )
    choice = echoed.choices[0]
    assert choice.text == "1, 2, 3, 4," + response.choices[0].text
    assert choice.logprobs.token_logprobs[0] is None and all(
        lp is not None for lp in choice.logprobs.token_logprobs[1:]
    )
    assert len(choice.logprobs.tokens) == echoed.usage.prompt_tokens + echoed.usage.completion_tokens


def test_completions_lists_and_token_ids(smol: LiveServer) -> None:
    sdk = smol.openai()
    tokenizer = smol.engine.loaded.tokenizer
    ids = tokenizer.encode("1, 2, 3, 4,")
    by_text = sdk.completions.create(model="smollm2", prompt="1, 2, 3, 4,", temperature=0, max_tokens=5)
    listed = sdk.completions.create(
        model="smollm2", prompt=["1, 2, 3, 4,", "The sky is"], temperature=0, max_tokens=5, n=2
    )
    by_ids = sdk.completions.create(model="smollm2", prompt=ids, temperature=0, max_tokens=5)
    batch_ids = sdk.completions.create(model="smollm2", prompt=[ids, ids], temperature=0, max_tokens=5)
    assert [c.index for c in listed.choices] == [0, 1, 2, 3]
    assert listed.choices[0].text == listed.choices[1].text == by_text.choices[0].text == by_ids.choices[0].text
    assert [c.text for c in batch_ids.choices] == [by_text.choices[0].text] * 2
    streamed = sdk.completions.create(
        model="smollm2", prompt=["1, 2, 3, 4,", "The sky is"], temperature=0, max_tokens=5, stream=True
    )
    texts: dict[int, str] = {}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: listed.choices[0].text, 1: listed.choices[2].text}


def test_models(smol: LiveServer) -> None:
    sdk = smol.openai()
    assert [m.id for m in sdk.models.list()] == ["smollm2"]
    assert sdk.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-5")


def test_response_format_json_schema_is_enforced(scripted: ScriptedFactory) -> None:
    server = scripted({"[json]": '{"city": "Paris", "population": 2102650}', "[prose]": "Paris is big."})
    sdk = server.openai()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    ok = sdk.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "[json]"}], response_format=fmt, temperature=0
    )
    assert json.loads(ok.choices[0].message.content) == {"city": "Paris", "population": 2102650}
    # the script wants prose; the grammar only lets JSON through
    forced = sdk.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "[prose]"}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=8,
    )
    assert forced.choices[0].message.content.lstrip().startswith("{")
    assert "Paris" not in forced.choices[0].message.content
