"""The ``atlas`` command: serve, generate, chat, bench, calibrate-kv, plugins."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from atlas_core.errors import AtlasError
from atlas_core.options.suggest import unknown_flags_message
from atlas_core.version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The ``atlas`` parser; each subcommand's module registers its own subparser and handler."""
    from atlas_core.bench import add_bench_parser
    from atlas_core.cli_calibrate import add_calibrate_parser
    from atlas_core.cli_plugins import add_plugins_parser
    from atlas_core.cli_run import add_chat_parser, add_generate_parser
    from atlas_core.server.cli_serve import add_serve_parser

    parser = argparse.ArgumentParser(
        prog="atlas", description="Atlas: LLM inference engine and OpenAI-compatible server"
    )
    parser.add_argument("--version", action="version", version=f"atlas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_parser(commands)
    add_generate_parser(commands)
    add_chat_parser(commands)
    add_bench_parser(commands)
    add_calibrate_parser(commands)
    add_plugins_parser(commands)
    return parser


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    """The parser of subcommand ``name`` of ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``atlas`` command; the exit status (2 for an `AtlasError`, printed as one line)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = _subcommand(parser, args.command) or parser
        command.error(unknown_flags_message(command, unknown))
    try:
        return int(args.handler(args) or 0)
    except AtlasError as exc:
        print(f"atlas: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
