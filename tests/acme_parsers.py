"""A throwaway plugin, ``atlas-parsers-acme``, that registers a tool-call format (``acme``:
``<acme>{"name": ..., "arguments": ...}</acme>``) and a reasoning format (``acme_think``), installed
the way pip installs it (`tests.plugin_site`) for the tests that use it through the parsing layer
and the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from atlas_core.plugins import get_registry
from tests.plugin_site import install_plugin

HOOKS = """
from atlas_core.hookspecs import hookimpl

@hookimpl
def register_tool_parsers(register):
    register("acme", "acme_formats:AcmeFormat")

@hookimpl
def register_reasoning_parsers(register):
    register("acme_think", "acme_formats:ACME_THINK")
"""

FORMATS = """
from atlas_core.parsing.reasoning import ReasoningFormat
from atlas_core.parsing.tools.base import ToolFormat, json_calls
from atlas_core.parsing.tools.grammar import call_object_schema, json_rule

class AcmeFormat(ToolFormat):
    name = "acme"
    starts = ("<acme>",)
    end = "</acme>"

    def parse(self, start, body):
        return json_calls(body, "the <acme> body")

    def grammar(self, tools, lit, parallel):
        call = f"{lit('<acme>')} {json_rule(call_object_schema(tools))} {lit('</acme>')}"
        return f"calls: call{'+' if parallel else ''}\\ncall: {call}\\n"

ACME_THINK = ReasoningFormat("acme_think", "<acme:think>", "</acme:think>")
"""

ACME_CALL = '<acme>{"name": "get_time", "arguments": {"zone": "UTC"}}</acme>'
"""``get_time(zone="UTC")`` in the ``acme`` format."""


@pytest.fixture
def acme_plugin(site: Path) -> Iterator[str]:
    """Installs ``atlas-parsers-acme`` and rebuilds the process-wide registry with it (and again
    without it afterwards); yields the distribution name."""
    install_plugin(
        site, "atlas-parsers-acme", "1.0", {"acme": "acme_hooks"}, {"acme_hooks": HOOKS, "acme_formats": FORMATS}
    )
    get_registry.cache_clear()
    yield "atlas-parsers-acme"
    get_registry.cache_clear()
