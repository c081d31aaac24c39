"""One text parser per setting type, chosen from a field's type annotation.

A parser turns the text of a flag or environment variable into a value, or raises `ValueError`
whose message states what is accepted and what was given.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

Parser = Callable[[str], Any]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``, any case."""
    lowered = text.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    accepted = ", ".join(f"{yes}/{no}" for yes, no in zip(TRUE_WORDS, FALSE_WORDS, strict=True))
    raise ValueError(f"expected one of {accepted}, got {text!r}")


def parse_int(text: str) -> int:
    """A whole number."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def parse_float(text: str) -> float:
    """A number (``0.9``, ``1e-3``, ``30``)."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def parse_str(text: str) -> str:
    """The text itself."""
    return text


def parse_list(text: str) -> list[str]:
    """Comma-separated items, each stripped; empty items are dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_json_object(text: str) -> dict[str, Any]:
    """A JSON object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"expected a JSON object, got text that is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got a JSON {type(value).__name__}")
    return value


def choice_parser(choices: tuple[str, ...]) -> Parser:
    """A parser accepting exactly one of ``choices``."""

    def parse_choice(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse_choice


PARSERS: dict[type, Parser] = {
    bool: parse_bool,
    int: parse_int,
    float: parse_float,
    str: parse_str,
    list: parse_list,
    dict: parse_json_object,
}
"""The parser of each setting type (``list`` is ``list[str]``, ``dict`` a JSON object)."""


def strip_optional(annotation: Any) -> Any:
    """``T | None`` (or ``Optional[T]``) -> ``T``; anything else unchanged."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def parser_for(annotation: Any) -> tuple[type, tuple[str, ...] | None, Parser]:
    """``(base type, choices or None, parser)`` of a field annotated ``annotation``.

    Supported: bool, int, float, str, ``Literal`` of strings (choices), ``list[str]``,
    ``dict[str, ...]``, each optionally ``| None``; `TypeError` for anything else.
    """
    annotation = strip_optional(annotation)
    if get_origin(annotation) is Literal:
        choices = tuple(str(choice) for choice in get_args(annotation))
        return str, choices, choice_parser(choices)
    base = get_origin(annotation) or annotation
    if base is list and get_args(annotation) not in ((), (str,)):
        raise TypeError(f"list settings hold strings, not {annotation}")
    if base not in PARSERS:
        raise TypeError(f"no setting parser for {annotation}")
    return base, None, PARSERS[base]
