"""Which output parsers a chat request uses, and one parser per completion.

Reasoning is split whenever the server has a reasoning parser. Tool calls are parsed when the
request offers tools and ``tool_choice`` is not ``none``; that needs a tool-call parser (flag or
family default), else the request is refused. With parallel tool calls turned off only the first
call is kept.
"""

from __future__ import annotations

from atlas_core.parsing import OutputParser
from atlas_core.parsing.types import ParsedMessage, StreamEvent, ToolCallArgumentsDelta, ToolCallStart
from atlas_core.server.chat_prompt import ChatSetup
from atlas_core.server.errors import invalid
from atlas_core.server.state import ServerState


class CompletionParser:
    """Parses one completion's text, fed in deltas; drops calls after the first when ``single_call``."""

    def __init__(self, parser: OutputParser, single_call: bool) -> None:
        self.parser = parser
        self.single_call = single_call
        self.called_tools = False

    def feed(self, text: str) -> list[StreamEvent]:
        return self._keep(self.parser.feed(text)) if text else []

    def finish(self) -> tuple[list[StreamEvent], ParsedMessage]:
        events, message = self.parser.finish()
        if self.single_call and len(message.tool_calls) > 1:
            message = ParsedMessage(message.content, message.reasoning, message.tool_calls[:1], message.problems)
        self.called_tools = self.called_tools or bool(message.tool_calls)
        return self._keep(events), message

    def _keep(self, events: list[StreamEvent]) -> list[StreamEvent]:
        kept = [
            e
            for e in events
            if not (self.single_call and isinstance(e, (ToolCallStart, ToolCallArgumentsDelta)) and e.index > 0)
        ]
        self.called_tools = self.called_tools or any(isinstance(e, ToolCallStart) for e in kept)
        return kept


class ParserSpec:
    """The parser settings of one request; `new` makes a fresh parser for each completion."""

    def __init__(self, state: ServerState, setup: ChatSetup, prompt_text: str) -> None:
        tool_parser = None
        if setup.tools and setup.tool_choice != "none":
            tool_parser = state.config.tool_call_parser
            if tool_parser is None:
                raise invalid(
                    "this server has no tool-call parser, so it cannot return tool calls; start it with "
                    "--tool-call-parser NAME, or send tool_choice 'none'",
                    param="tools",
                )
        self.reasoning_parser = state.config.reasoning_parser
        self.tool_parser = tool_parser
        self.setup = setup
        self.prompt_text = prompt_text
        self.new()  # unknown parser names and unusable tool schemas fail here, before generation

    def new(self) -> CompletionParser:
        parser = OutputParser(
            reasoning_parser=self.reasoning_parser,
            tool_parser=self.tool_parser,
            tools=self.setup.tools,
            prompt_text=self.prompt_text,
            tool_choice=self.setup.tool_choice,
        )
        return CompletionParser(parser, single_call=not self.setup.parallel_tool_calls)
