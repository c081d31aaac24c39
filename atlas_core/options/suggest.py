"""Helpful command-line errors: the nearest known flag for a misspelt one, and flags that other
servers have but this one does not support yet."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn


def known_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--flag`` spelling ``parser`` accepts (aliases and ``--no-`` forms included)."""
    return sorted({name for action in parser._actions for name in action.option_strings if name.startswith("--")})


def unknown_flags_message(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """argparse's ``unrecognized arguments`` message for ``unknown``, with the nearest known flag of
    each misspelt one (``--max-num-seq``: did you mean --max-num-seqs?)."""
    flags = known_flags(parser)
    hints = []
    for arg in unknown:
        name = arg.split("=", 1)[0]
        if not name.startswith("--"):
            continue
        close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    message = f"unrecognized arguments: {' '.join(unknown)}"
    return message + ("; " + "; ".join(hints) if hints else "")


def add_unsupported_flag(parser: argparse.ArgumentParser, flag: str, reason: str) -> None:
    """Accept ``--flag`` only to stop with a clear error (``--flag is not supported yet: reason``),
    for flags users bring from other servers whose setting does not exist here."""

    class Unsupported(argparse.Action):
        def __call__(
            self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None
        ) -> NoReturn:
            parser.error(f"{flag} is not supported yet: {reason}")

    parser.add_argument(flag, action=Unsupported, nargs="?", help=argparse.SUPPRESS)
