"""Tool-call and reasoning formats are plug points: a plugin's formats are selected by name like
core's, listed by ``atlas plugins``, and broken or clashing registrations fail with the plugin named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlas_core.cli_plugins import plugins_report
from atlas_core.errors import PluginError
from atlas_core.parsing import OutputParser, UnknownParserError, reasoning_parser_names, tool_parser_names
from atlas_core.plugins import get_registry, load_plugins
from atlas_core.testing.grammars import check_canonical_markup, check_grammar_outputs_parse
from atlas_core.testing.parsers import TOOLS, check_streams_like_whole
from tests.acme_parsers import ACME_CALL, acme_plugin  # noqa: F401 (fixture)
from tests.plugin_site import clean_env, install_plugin, site  # noqa: F401 (fixtures)


@pytest.mark.usefixtures("acme_plugin")
def test_a_plugin_format_is_selected_by_name_like_cores() -> None:
    assert "acme" in tool_parser_names() and "acme_think" in reasoning_parser_names()
    text = "<acme:think>The time, then.</acme:think>Checking. " + ACME_CALL
    args = {"reasoning_parser": "acme_think", "tool_parser": "acme", "tools": TOOLS}
    message = OutputParser.parse(text, **args)
    assert (message.reasoning, message.content, message.problems) == ("The time, then.", "Checking.", [])
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [("get_time", {"zone": "UTC"})]
    check_streams_like_whole(list(text), **args)
    check_canonical_markup("acme", ACME_CALL)
    check_grammar_outputs_parse("acme", "required")
    with pytest.raises(UnknownParserError, match=r"unknown tool-call parser 'acmee'; valid names: acme, .*hermes"):
        OutputParser(tool_parser="acmee", tools=TOOLS)


def test_atlas_plugins_lists_the_formats_with_their_plugin(acme_plugin: str) -> None:
    [entry] = [p for p in plugins_report(load_plugins(), check=True)["plugins"] if p["distribution"] == acme_plugin]
    assert [(r["kind"], r["name"], r["check"]["status"]) for r in entry["registrations"]] == [
        ("tool_parser", "acme", "ok"),
        ("reasoning_parser", "acme_think", "ok"),
    ]
    core = next(p for p in plugins_report(get_registry())["plugins"] if p["distribution"] == "atlas-core")
    assert {r["name"] for r in core["registrations"] if r["kind"] == "tool_parser"} >= {"hermes", "json", "qwen3_coder"}


BROKEN = """
from atlas_core.hookspecs import hookimpl
from atlas_core.parsing.reasoning import ReasoningFormat

class NotAFormat:
    pass

MISNAMED = ReasoningFormat("something_else", "<a>", "</a>")

@hookimpl
def register_tool_parsers(register):
    register("not_a_format", "broken_formats:NotAFormat")
    register("hermes", "atlas_core.parsing.tools.json_formats:HermesFormat")

@hookimpl
def register_reasoning_parsers(register):
    register("misnamed", "broken_formats:MISNAMED")
"""


def test_broken_and_clashing_formats_name_the_plugin(site: Path) -> None:
    install_plugin(site, "atlas-parsers-broken", "0.1", {"broken": "broken_formats"}, {"broken_formats": BROKEN})
    get_registry.cache_clear()
    try:
        with pytest.raises(
            PluginError, match=r"'not_a_format' from atlas-parsers-broken 0\.1: .* not a subclass of .*ToolFormat"
        ):
            OutputParser(tool_parser="not_a_format", tools=TOOLS)
        with pytest.raises(
            PluginError, match=r"'misnamed' from atlas-parsers-broken 0\.1: .* is named 'something_else'"
        ):
            OutputParser(reasoning_parser="misnamed")
        with pytest.raises(
            PluginError, match=r"'hermes' is registered by both atlas-core .* and atlas-parsers-broken 0\.1"
        ):
            OutputParser(tool_parser="hermes", tools=TOOLS)
        OutputParser(tool_parser="json", reasoning_parser="qwen3", tools=TOOLS)  # other names still resolve
        [entry] = [p for p in plugins_report(get_registry(), check=True)["plugins"] if p["name"] == "broken"]
        assert [r["check"]["status"] for r in entry["registrations"]] == ["failed", "ok", "failed"]
    finally:
        get_registry.cache_clear()
