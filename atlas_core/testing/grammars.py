"""Grammar checks for tool-call formats, core's or a plugin's: every text a ``tool_choice`` grammar
allows parses back to valid calls (`check_grammar_outputs_parse`: random walks through the grammar
on a byte-level tokenizer, `byte_tokenizer`), and canonical markup is allowed and parsed
(`check_canonical_markup`); `check_plugin_tool_format` runs both for a format a plugin registers.
"""

from __future__ import annotations

import json
import random

import llguidance
import numpy as np
import tokenizers
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
from tokenizers import decoders, models, pre_tokenizers

from atlas_core.parsing import OutputParser, StructuredOutput, ToolChoice, ToolDefinition, tool_call_constraint
from atlas_core.plugins import get_registry
from atlas_core.testing.parsers import TOOLS
from atlas_core.tokenizer import Tokenizer

SPECIAL = ["<eos>", "[TOOL_CALLS]", "[THINK]", "[/THINK]"]
"""The special tokens of `byte_tokenizer` by default: EOS and Mistral's markers."""


def byte_tokenizer(special: list[str] = SPECIAL) -> Tokenizer:
    """One token per byte, plus ``special`` as special tokens (the first one is EOS)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(special)
    eos = backend.token_to_id(special[0])
    assert eos is not None, "a special token just added has an id"
    return Tokenizer(backend, bos_token_id=None, eos_token_ids=[eos], chat_template=None)


TOKENIZER = byte_tokenizer()
"""The byte-level tokenizer the checks use unless given another."""

BOUNDED = [  # parameters with no free text, so random walks end quickly
    ToolDefinition(
        "set_level",
        parameters={
            "type": "object",
            "properties": {
                "level": {"type": "integer"},
                "mode": {"type": "string", "enum": ["fast", "slow"]},
                "on": {"type": "boolean"},
            },
            "required": ["level", "mode"],
            "additionalProperties": False,
        },
    ),
    ToolDefinition(
        "reset",
        parameters={
            "type": "object",
            "properties": {"hard": {"type": "boolean"}},
            "required": ["hard"],
            "additionalProperties": False,
        },
    ),
]


def matcher(structured: StructuredOutput, tokenizer: Tokenizer = TOKENIZER) -> llguidance.LLMatcher:
    """A fresh llguidance matcher of ``structured``'s grammar over ``tokenizer``'s vocabulary."""
    ll_tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=tokenizer.eos_token_ids)
    m = llguidance.LLMatcher(ll_tokenizer, structured.llguidance_grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(structured: StructuredOutput, text: str, tokenizer: Tokenizer = TOKENIZER) -> bool:
    """Whether the grammar allows exactly ``text`` (its tokens, then the end)."""
    m = matcher(structured, tokenizer)
    return m.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and m.is_accepting()


def random_walk(
    structured: StructuredOutput, rng: random.Random, limit: int = 4000, tokenizer: Tokenizer = TOKENIZER
) -> str:
    """Sample allowed tokens uniformly (EOS, once allowed, half the time) until the grammar ends."""
    eos, vocab_size = tokenizer.eos_token_ids[0], tokenizer.backend.get_vocab_size()
    m = matcher(structured, tokenizer)
    bitmask = allocate_token_bitmask(1, vocab_size)
    tokens: list[int] = []
    for _ in range(limit):
        fill_next_token_bitmask(m, bitmask, 0)
        allowed = np.flatnonzero(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:vocab_size])
        assert len(allowed), "the grammar allowed nothing"
        if eos in allowed and (len(allowed) == 1 or rng.random() < 0.5):
            return tokenizer.decode(tokens, skip_special_tokens=False)
        token = int(rng.choice([t for t in allowed if t != eos]))
        assert m.consume_token(token)
        tokens.append(token)
    raise AssertionError(f"no end after {limit} tokens: {tokenizer.decode(tokens, skip_special_tokens=False)[:200]!r}")


def check_grammar_outputs_parse(parser: str, choice: ToolChoice, tokenizer: Tokenizer = TOKENIZER) -> None:
    """15 random texts of ``parser``'s grammar for ``tool_choice`` ``choice`` (``"required"``: parallel
    calls of `BOUNDED`; a named tool: one call of it) each parse to calls only, without problems."""
    parallel = choice == "required"
    structured = tool_call_constraint(parser, BOUNDED, choice, tokenizer=tokenizer, parallel_tool_calls=parallel)
    assert structured is not None, f"tool_choice {choice!r} constrains nothing"
    rng = random.Random(f"{parser}-{choice}")
    for _ in range(15):
        text = random_walk(structured, rng, tokenizer=tokenizer)
        message = OutputParser.parse(text, tool_parser=parser, tools=BOUNDED, tool_choice=choice)
        assert message.problems == [], (text, message.problems)
        assert message.content == "" and message.tool_calls, text
        if not parallel:
            assert [c.name for c in message.tool_calls] == ["reset"]


def check_canonical_markup(parser: str, call: str, tokenizer: Tokenizer = TOKENIZER) -> None:
    """``call``, the canonical markup of ``get_time(zone="UTC")`` in ``parser``'s format, is what its
    grammar for that named tool allows (and not with another tool's name), and parses to that call."""
    structured = tool_call_constraint(parser, TOOLS, {"name": "get_time"}, tokenizer=tokenizer)
    assert structured is not None and structured.kind == "tool_call"
    assert accepts(structured, call, tokenizer)
    assert not accepts(structured, call.replace("get_time", "get_weather", 1), tokenizer)
    message = OutputParser.parse(call, tool_parser=parser, tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [("get_time", {"zone": "UTC"})]


def check_plugin_tool_format(parser: str, distribution: str, canonical_call: str) -> None:
    """The tool-call format ``parser`` is registered by ``distribution``, its grammars for required and
    named ``tool_choice`` generate only calls that parse (`check_grammar_outputs_parse`), and
    ``canonical_call`` is its markup of ``get_time(zone="UTC")`` (`check_canonical_markup`)."""
    assert get_registry().get("tool_parser", parser).plugin.distribution == distribution
    for choice in ("required", {"name": "reset"}):
        check_grammar_outputs_parse(parser, choice)
    check_canonical_markup(parser, canonical_call)
