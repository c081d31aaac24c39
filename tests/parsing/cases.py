"""Scripted model outputs for core's tool-call formats: (parser, text, content, calls, problem words).

``calls`` are (name, arguments object) pairs; ``problems`` are substrings, one per expected problem.
A family plugin's tests hold the cases of its own formats (`atlas_core.testing.parsers.check_tool_case`).
"""

from __future__ import annotations

from atlas_core.testing.parsers import PARIS, ROME3, UTC, ToolCallCase

CASES = [
    # hermes
    ToolCallCase(
        "hermes-single",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [PARIS],
    ),
    ToolCallCase(
        "hermes-parallel",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
        "",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "hermes-after-text",
        "hermes",
        'Let me look that up.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
        "Let me look that up.",
        [PARIS],
    ),
    ToolCallCase(
        "hermes-text-between",
        "hermes",
        'First <tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call> then more text.',
        "First then more text.",
        [UTC],
    ),
    ToolCallCase(
        "hermes-malformed",
        "hermes",
        'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        [],
        ("not valid JSON",),
    ),
    ToolCallCase(
        "hermes-unknown-tool",
        "hermes",
        '<tool_call>\n{"name": "book_flight", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "book_flight", "arguments": {}}\n</tool_call>',
        [],
        ("unknown tool 'book_flight'",),
    ),
    ToolCallCase(
        "hermes-fuzzy-name-and-coercion",
        "hermes",
        '<tool_call>\n{"name": "Get Weather", "arguments": {"city": "Rome", "days": "3", "metric": "true", '
        '"options": "{\\"hourly\\": \\"false\\"}"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Rome", "days": 3, "metric": True, "options": {"hourly": False}})],
    ),
    ToolCallCase(
        "hermes-arguments-as-string",
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}\n</tool_call>',
        "",
        [UTC],
    ),
    ToolCallCase(
        "hermes-schema-mismatch",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": "many"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": "many"}}\n</tool_call>',
        [],
        ("do not match its schema",),
    ),
    ToolCallCase(
        "hermes-unclosed-but-complete",
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n',
        "Sure.",
        [UTC],
    ),
    ToolCallCase(
        "hermes-truncated",
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_time", "argu',
        'Sure.\n<tool_call>\n{"name": "get_time", "argu',
        [],
        ("output ended before </tool_call>",),
    ),
    ToolCallCase(
        "hermes-plain-text",
        "hermes",
        "No tools needed: 2 < 3 and <tool is fine.\n",
        "No tools needed: 2 < 3 and <tool is fine.\n",
        [],
    ),
    ToolCallCase(
        "hermes-one-good-one-bad",
        "hermes",
        '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>\n'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        [UTC],
        ("unknown tool 'nope'",),
    ),
    # qwen3_coder
    ToolCallCase(
        "qwen3_coder-single",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "",
        [PARIS],
    ),
    ToolCallCase(
        "qwen3_coder-parallel-typed",
        "qwen3_coder",
        "I'll check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
        "</function>\n</tool_call>",
        "I'll check both.",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "qwen3_coder-object-and-multiline",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=options>\n"
        '{"hourly": true}\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n</function>\n</tool_call>',
        "",
        [("get_weather", {"city": "New\nYork", "options": {"hourly": True}, "metric": False})],
    ),
    ToolCallCase(
        "qwen3_coder-malformed",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",
        [],
        ("text outside <parameter",),
    ),
    ToolCallCase(
        "qwen3_coder-unknown-tool",
        "qwen3_coder",
        "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
        "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
        [],
        ("unknown tool 'launch'",),
    ),
    # mistral
    ToolCallCase(
        "mistral-list", "mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]
    ),
    ToolCallCase(
        "mistral-list-parallel-after-text",
        "mistral",
        'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "UTC"}}]',
        "Checking.",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "mistral-args-form",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 3}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}',
        "",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "mistral-malformed",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}',
        [],
        ("not valid JSON",),
    ),
    # json fallback
    ToolCallCase("json-object", "json", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
    ToolCallCase(
        "json-fenced-list-parameters",
        "json",
        '```json\n[{"name": "get_weather", "parameters": {"city": "Rome", "days": "3"}}, '
        '{"name": "get_time", "parameters": {"zone": "UTC"}}]\n```',
        "",
        [ROME3, UTC],
    ),
    ToolCallCase("json-not-a-call", "json", '{"answer": 42}', '{"answer": 42}', []),
    ToolCallCase("json-plain-text", "json", "The answer is {42}.", "The answer is {42}.", []),
    ToolCallCase(
        "json-unknown-tool",
        "json",
        '{"name": "fly", "arguments": {}}',
        '{"name": "fly", "arguments": {}}',
        [],
        ("unknown tool 'fly'",),
    ),
    # nemotron
    ToolCallCase(
        "nemotron-parallel",
        "nemotron",
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "UTC"}}]</TOOLCALL>',
        "",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "nemotron-malformed",
        "nemotron",
        "Hm <TOOLCALL>[oops]</TOOLCALL> done",
        "Hm <TOOLCALL>[oops]</TOOLCALL> done",
        [],
        ("not valid JSON",),
    ),
]
