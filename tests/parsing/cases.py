"""Scripted model outputs for every tool-call format: (parser, text, content, calls, problem words).

``calls`` are (name, arguments object) pairs; ``problems`` are substrings, one per expected problem.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Case(NamedTuple):
    id: str
    parser: str
    text: str
    content: str
    calls: list[tuple[str, dict[str, Any]]]
    problems: tuple[str, ...] = ()


PARIS = ("get_weather", {"city": "Paris"})
ROME3 = ("get_weather", {"city": "Rome", "days": 3})
UTC = ("get_time", {"zone": "UTC"})
DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
Q = '<|"|>'  # Gemma 4's string delimiter
G4, G4_END = "<|tool_call>call:", "<tool_call|>"

CASES = [
    # hermes
    Case(
        "hermes-single",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [PARIS],
    ),
    Case(
        "hermes-parallel",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
        "",
        [ROME3, UTC],
    ),
    Case(
        "hermes-after-text",
        "hermes",
        'Let me look that up.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
        "Let me look that up.",
        [PARIS],
    ),
    Case(
        "hermes-text-between",
        "hermes",
        'First <tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call> then more text.',
        "First then more text.",
        [UTC],
    ),
    Case(
        "hermes-malformed",
        "hermes",
        'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        [],
        ("not valid JSON",),
    ),
    Case(
        "hermes-unknown-tool",
        "hermes",
        '<tool_call>\n{"name": "book_flight", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "book_flight", "arguments": {}}\n</tool_call>',
        [],
        ("unknown tool 'book_flight'",),
    ),
    Case(
        "hermes-fuzzy-name-and-coercion",
        "hermes",
        '<tool_call>\n{"name": "Get Weather", "arguments": {"city": "Rome", "days": "3", "metric": "true", '
        '"options": "{\\"hourly\\": \\"false\\"}"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Rome", "days": 3, "metric": True, "options": {"hourly": False}})],
    ),
    Case(
        "hermes-arguments-as-string",
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}\n</tool_call>',
        "",
        [UTC],
    ),
    Case(
        "hermes-schema-mismatch",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": "many"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": "many"}}\n</tool_call>',
        [],
        ("do not match its schema",),
    ),
    Case(
        "hermes-unclosed-but-complete",
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n',
        "Sure.",
        [UTC],
    ),
    Case(
        "hermes-truncated",
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_time", "argu',
        'Sure.\n<tool_call>\n{"name": "get_time", "argu',
        [],
        ("output ended before </tool_call>",),
    ),
    Case(
        "hermes-plain-text",
        "hermes",
        "No tools needed: 2 < 3 and <tool is fine.\n",
        "No tools needed: 2 < 3 and <tool is fine.\n",
        [],
    ),
    Case(
        "hermes-one-good-one-bad",
        "hermes",
        '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>\n'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        [UTC],
        ("unknown tool 'nope'",),
    ),
    # qwen3_coder
    Case(
        "qwen3_coder-single",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "",
        [PARIS],
    ),
    Case(
        "qwen3_coder-parallel-typed",
        "qwen3_coder",
        "I'll check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
        "</function>\n</tool_call>",
        "I'll check both.",
        [ROME3, UTC],
    ),
    Case(
        "qwen3_coder-object-and-multiline",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=options>\n"
        '{"hourly": true}\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n</function>\n</tool_call>',
        "",
        [("get_weather", {"city": "New\nYork", "options": {"hourly": True}, "metric": False})],
    ),
    Case(
        "qwen3_coder-malformed",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",
        [],
        ("text outside <parameter",),
    ),
    Case(
        "qwen3_coder-unknown-tool",
        "qwen3_coder",
        "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
        "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
        [],
        ("unknown tool 'launch'",),
    ),
    # mistral
    Case(
        "mistral-list", "mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]
    ),
    Case(
        "mistral-list-parallel-after-text",
        "mistral",
        'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "UTC"}}]',
        "Checking.",
        [ROME3, UTC],
    ),
    Case(
        "mistral-args-form",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 3}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}',
        "",
        [ROME3, UTC],
    ),
    Case(
        "mistral-malformed",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}',
        [],
        ("not valid JSON",),
    ),
    # json fallback
    Case("json-object", "json", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
    Case(
        "json-fenced-list-parameters",
        "json",
        '```json\n[{"name": "get_weather", "parameters": {"city": "Rome", "days": "3"}}, '
        '{"name": "get_time", "parameters": {"zone": "UTC"}}]\n```',
        "",
        [ROME3, UTC],
    ),
    Case("json-not-a-call", "json", '{"answer": 42}', '{"answer": 42}', []),
    Case("json-plain-text", "json", "The answer is {42}.", "The answer is {42}.", []),
    Case(
        "json-unknown-tool",
        "json",
        '{"name": "fly", "arguments": {}}',
        '{"name": "fly", "arguments": {}}',
        [],
        ("unknown tool 'fly'",),
    ),
    # deepseek_v3
    Case(
        "deepseek_v3-parallel",
        "deepseek_v3",
        f"Let me check.{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n"
        + '{"city": "Rome", "days": 3}\n```'
        + f"{DS_CALL_END}{DS_CALL}function{DS_SEP}get_time\n```json\n"
        + '{"zone": "UTC"}\n```'
        + f"{DS_CALL_END}{DS_END}",
        "Let me check.",
        [ROME3, UTC],
    ),
    Case(
        "deepseek_v3.1-form",
        "deepseek_v3",
        f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris"}}{DS_CALL_END}{DS_END}',
        "",
        [PARIS],
    ),
    Case(
        "deepseek_v3-malformed",
        "deepseek_v3",
        f"{DS_BEGIN}{DS_CALL}get_weather{{}}{DS_CALL_END}{DS_END}",
        f"{DS_BEGIN}{DS_CALL}get_weather{{}}{DS_CALL_END}{DS_END}",
        [],
        ("lacks",),
    ),
    # minimax_m2
    Case(
        "minimax_m2-parallel",
        "minimax_m2",
        'Okay.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n'
        '<parameter name="zone">UTC</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        "Okay.",
        [ROME3, UTC],
    ),
    Case(
        "minimax_m2-unknown",
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="x">\n</invoke>\n</minimax:tool_call>',
        '<minimax:tool_call>\n<invoke name="x">\n</invoke>\n</minimax:tool_call>',
        [],
        ("unknown tool 'x'",),
    ),
    # nemotron
    Case(
        "nemotron-parallel",
        "nemotron",
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "UTC"}}]</TOOLCALL>',
        "",
        [ROME3, UTC],
    ),
    Case(
        "nemotron-malformed",
        "nemotron",
        "Hm <TOOLCALL>[oops]</TOOLCALL> done",
        "Hm <TOOLCALL>[oops]</TOOLCALL> done",
        [],
        ("not valid JSON",),
    ),
    # gemma4
    Case("gemma4-single", "gemma4", f"{G4}get_weather{{city:{Q}Paris{Q}}}{G4_END}", "", [PARIS]),
    Case(
        "gemma4-parallel-after-text",
        "gemma4",
        f"I'll check both.\n{G4}get_weather{{city:{Q}Rome{Q},days:3}}{G4_END}{G4}get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        "I'll check both.",
        [ROME3, UTC],
    ),
    Case(
        "gemma4-strings-hold-markup-characters",
        "gemma4",
        f'{G4}get_weather{{city:{Q}Paris, "TX" {{a:1}} [b], c:d\\n{Q}}}{G4_END} then text',
        "then text",
        [("get_weather", {"city": 'Paris, "TX" {a:1} [b], c:d\\n'})],
    ),
    Case(
        "gemma4-nested-values",
        "gemma4",
        f"{G4}get_weather{{city:{Q}Oslo{Q},days:-2,metric:false,options:{{hourly:true}},"
        f"tags:[{Q}a,b{Q},1.5e3,null,{{k:[]}},[0.25,true]]}}{G4_END}",
        "",
        [
            (
                "get_weather",
                {
                    "city": "Oslo",
                    "days": -2,
                    "metric": False,
                    "options": {"hourly": True},
                    "tags": ["a,b", 1500.0, None, {"k": []}, [0.25, True]],
                },
            )
        ],
    ),
    Case(
        "gemma4-fuzzy-name-and-coercion",
        "gemma4",
        f"{G4}Get-Weather{{city:{Q}Rome{Q},days:{Q}3{Q},metric:{Q}true{Q},"
        f'options:{Q}{{"hourly": "false"}}{Q}}}{G4_END}',
        "",
        [("get_weather", {"city": "Rome", "days": 3, "metric": True, "options": {"hourly": False}})],
    ),
    Case(
        "gemma4-bare-string",
        "gemma4",
        f"Hi {G4}get_weather{{city:Paris}}{G4_END}",
        f"Hi {G4}get_weather{{city:Paris}}{G4_END}",
        [],
        ("'Paris' is not a number",),
    ),
    Case(
        "gemma4-unclosed-string",
        "gemma4",
        f"{G4}get_time{{zone:{Q}UTC}}{G4_END}",
        f"{G4}get_time{{zone:{Q}UTC}}{G4_END}",
        [],
        ("never closed",),
    ),
    Case(
        "gemma4-no-call-prefix",
        "gemma4",
        f"<|tool_call>get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        f"<|tool_call>get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        [],
        ("must hold call:NAME",),
    ),
    Case(
        "gemma4-text-after-arguments",
        "gemma4",
        f"{G4}get_time{{zone:{Q}UTC{Q}}} and more{G4_END}",
        f"{G4}get_time{{zone:{Q}UTC{Q}}} and more{G4_END}",
        [],
        ("text after the arguments of 'get_time'",),
    ),
    Case(
        "gemma4-schema-mismatch",
        "gemma4",
        f"{G4}get_weather{{city:{Q}Rome{Q},days:{Q}many{Q}}}{G4_END}",
        f"{G4}get_weather{{city:{Q}Rome{Q},days:{Q}many{Q}}}{G4_END}",
        [],
        ("do not match its schema",),
    ),
    Case(
        "gemma4-unknown-and-known",
        "gemma4",
        f"{G4}launch{{}}{G4_END}\n{G4}get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        f"{G4}launch{{}}{G4_END}",
        [UTC],
        ("unknown tool 'launch'",),
    ),
    Case(
        "gemma4-unclosed-but-complete",
        "gemma4",
        f"Sure.\n{G4}get_time{{zone:{Q}UTC{Q}}}",
        "Sure.",
        [UTC],
    ),
    Case(
        "gemma4-truncated",
        "gemma4",
        f"Sure.\n{G4}get_time{{zone:{Q}UT",
        f"Sure.\n{G4}get_time{{zone:{Q}UT",
        [],
        ("output ended before <tool_call|>",),
    ),
    Case("gemma4-plain-text", "gemma4", "a <|tool, <tool_call|> are text", "a <|tool, <tool_call|> are text", []),
]
