"""The server selects a plugin's tool-call and reasoning formats by name like core's: a live server
configured with them returns the model's calls and reasoning, whole and streamed."""

from __future__ import annotations

import json

from tests.acme_parsers import ACME_CALL, acme_plugin  # noqa: F401 (fixture)
from tests.plugin_site import clean_env, site  # noqa: F401 (fixtures)
from tests.server.conftest import ScriptedFactory
from tests.server.test_tool_calls import ASK, OPENAI_TOOLS


def test_a_plugin_format_serves_tool_calls_and_reasoning(scripted: ScriptedFactory, acme_plugin: str) -> None:
    script = {"[ask]": "<acme:think>The time first.</acme:think>" + ACME_CALL}
    server = scripted(script, tool_call_parser="acme", reasoning_parser="acme_think")
    sdk = server.openai()

    whole = sdk.chat.completions.create(model="scripted", messages=ASK, tools=OPENAI_TOOLS)
    message = whole.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_time", {"zone": "UTC"})
    ]
    assert (message.content or "", message.model_extra["reasoning_content"]) == ("", "The time first.")
    assert whole.choices[0].finish_reason == "tool_calls"

    chunks = list(sdk.chat.completions.create(model="scripted", messages=ASK, tools=OPENAI_TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert [tc.function.name for d in deltas for tc in d.tool_calls or [] if tc.id] == ["get_time"]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "The time first."
    assert not "".join(d.content or "" for d in deltas)
