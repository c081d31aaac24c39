"""The model-output layer: tool-call and reasoning parsers over generated text, and the
constraints (grammars, thinking budgets) that make the model produce what a request asks for.

Parsing (streaming or whole)::

    parser = OutputParser(reasoning_parser="qwen3", tool_parser="hermes", tools=[...],
                          prompt_text=rendered_prompt, tool_choice="auto")
    events = parser.feed(delta_text)          # ContentDelta / ReasoningDelta / ToolCallStart / ...
    events, message = parser.finish()         # the rest, and the whole ParsedMessage
    message = OutputParser.parse(full_text, reasoning_parser=..., tool_parser=..., tools=...)

Constraints, set on `SamplingParams` (``structured=``, ``thinking_budget=``)::

    tool_call_constraint(tool_parser, tools, tool_choice, tokenizer=..., reasoning_parser=..., prompt_text=...)
    response_format_constraint(response_format, tokenizer=..., reasoning_parser=..., prompt_text=...)
    thinking_budget(reasoning_parser, tokenizer, prompt_text, budget_tokens)
    needs_special_tokens(tokenizer, reasoning_parser, tool_parser)   # -> detokenize with skip_special_tokens=False
"""

from atlas_core.parsing.constraints import (
    needs_special_tokens,
    response_format_constraint,
    thinking_budget,
    tool_call_constraint,
)
from atlas_core.parsing.errors import ToolSchemaError, UnknownParserError
from atlas_core.parsing.output_parser import OutputParser, ToolChoice
from atlas_core.parsing.registry import reasoning_parser_names, tool_parser_names
from atlas_core.parsing.structured import StructuredOutput, StructuredOutputError, ThinkingBudget
from atlas_core.parsing.types import (
    ContentDelta,
    ParsedMessage,
    ReasoningDelta,
    StreamEvent,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolDefinition,
)

__all__ = [
    "ContentDelta",
    "OutputParser",
    "ParsedMessage",
    "ReasoningDelta",
    "StreamEvent",
    "StructuredOutput",
    "StructuredOutputError",
    "ThinkingBudget",
    "ToolCall",
    "ToolCallArgumentsDelta",
    "ToolCallStart",
    "ToolChoice",
    "ToolDefinition",
    "ToolSchemaError",
    "UnknownParserError",
    "needs_special_tokens",
    "reasoning_parser_names",
    "response_format_constraint",
    "thinking_budget",
    "tool_call_constraint",
    "tool_parser_names",
]
