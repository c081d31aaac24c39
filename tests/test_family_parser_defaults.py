"""Every installed model family's serving defaults name registered parsers (core's or a plugin's,
through the ``register_tool_parsers`` / ``register_reasoning_parsers`` hooks) that load, so serving
a family with its defaults never fails on an unknown or broken parser name."""

from __future__ import annotations

import pytest

from atlas_core.parsing import OutputParser, ToolDefinition, reasoning_parser_names, tool_parser_names
from atlas_core.plugins import get_registry

FAMILIES = get_registry().registrations("model")
PARSER_KEYS = {"tool_call_parser": tool_parser_names, "reasoning_parser": reasoning_parser_names}


def test_the_model_families_of_the_workspace_are_installed() -> None:
    names = {r.name for r in FAMILIES}
    assert {"llama", "qwen3", "gemma3", "gemma4", "deepseek_v3", "minimax_m2", "nemotron_h"} <= names, names


@pytest.mark.parametrize("family", FAMILIES, ids=[f"{r.plugin.distribution}:{r.name}" for r in FAMILIES])
def test_default_parsers_exist(family) -> None:
    defaults = family.metadata.get("defaults", {})
    assert isinstance(defaults, dict), f"{family.name}: defaults must be a dict, got {defaults!r}"
    for key, valid_names in PARSER_KEYS.items():
        name = defaults.get(key)
        assert name is None or name in valid_names(), (
            f"model family {family.name!r} ({family.plugin.label}) defaults {key}={name!r}, "
            f"which is not one of {', '.join(valid_names())}"
        )
    OutputParser(  # the pair the server builds for a request with tools
        reasoning_parser=defaults.get("reasoning_parser"),
        tool_parser=defaults.get("tool_call_parser"),
        tools=[ToolDefinition("f")],
    )
