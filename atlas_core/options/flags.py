"""Command-line flags generated from settings (`Option`), and the values given on a command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from atlas_core.options.declare import Option
from atlas_core.options.parsers import Parser


def _flag_type(parse: Parser) -> Parser:
    """``parse`` with its `ValueError` turned into argparse's error, so that a bad flag reads
    ``argument --port: expected an integer, got 'x'``."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def add_flags(parser: argparse.ArgumentParser, options: Sequence[Option], *, with_defaults: bool = True) -> None:
    """Add one argument per setting to ``parser``, its help ending with the default.

    ``with_defaults`` False: a flag that is not given is left out of the parsed namespace (so that
    the environment and family defaults can fill it in; see `parsed_values`).
    """
    for opt in options:
        kwargs: dict[str, Any] = {"default": opt.default if with_defaults else argparse.SUPPRESS}
        if opt.info.metavar:
            kwargs["metavar"] = opt.info.metavar
        if opt.kind is bool and opt.flag_name.startswith("no-"):
            kwargs["action"] = "store_true"  # a negative switch (--no-web-ui) gets no --no-no-... twin
        elif opt.kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif opt.kind is list and opt.info.repeat:
            kwargs["action"] = "append"
        elif opt.kind is list:
            kwargs["nargs"] = "+"
        else:
            kwargs["type"] = _flag_type(opt.parse)
            if opt.choices:
                kwargs["choices"] = opt.choices
        if opt.info.positional:
            action = parser.add_argument(opt.name, nargs="?", **kwargs)
        else:
            names = [f"--{name}" for name in (opt.flag_name, *opt.info.aliases)]
            action = parser.add_argument(*names, dest=opt.name, **kwargs)
        action.help = opt.help_text  # set after construction: BooleanOptionalAction would append its own default


def parsed_values(namespace: argparse.Namespace, options: Sequence[Option]) -> dict[str, Any]:
    """The settings present in the parsed ``namespace``, by name: all of them, or with
    ``with_defaults`` False only those given on the command line."""
    present = vars(namespace)
    return {opt.name: present[opt.name] for opt in options if opt.name in present}
