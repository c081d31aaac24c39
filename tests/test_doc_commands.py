"""Every ``atlas`` command line the documentation shows with flags runs as written: its subcommands exist and each
``--flag`` is one of that subcommand's options (README.md, docs/*.md and the plugins' READMEs; values are not
checked, so placeholders such as MODEL stay)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from atlas_core.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"\batlas ((?:serve|generate|chat|bench|calibrate-kv|plugins)\b[^`\n]*)")
"""An ``atlas`` command in a code line or inline code, up to the end of either."""
END = re.compile(r"\s#|\s&|\||;|\s>")
"""Where a shell line's command ends: a comment, a background or chained command, a pipe, a redirect."""


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("plugins/**/README.md"))]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def problems_of(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What does not exist in ``atlas WORDS``: a subcommand, or a flag of the subcommand reached."""
    path: list[str] = []
    rest = list(words)
    while (choices := subcommands(parser)) is not None:
        if not rest or rest[0] not in choices:
            return [f"atlas {' '.join(path)} has no subcommand {rest[0] if rest else '(none given)'}"]
        path.append(rest[0])
        parser = choices[rest.pop(0)]
    known = {flag for action in parser._actions for flag in action.option_strings}
    flags = [word.strip("[]").split("=")[0] for word in rest if word.strip("[]").startswith("--")]
    return [f"atlas {' '.join(path)} has no option {flag}" for flag in flags if flag not in known]


def test_documented_commands_use_existing_subcommands_and_flags() -> None:
    parser, checked, problems = build_parser(), 0, []
    for document in documents():
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            for match in COMMAND.finditer(line):
                words = shlex.split(END.split(match.group(1))[0])
                if any(word.strip("[]").startswith("--") for word in words):
                    checked += 1
                    where = f"{document.relative_to(ROOT)}:{number}"
                    problems += [f"{where}: {problem}" for problem in problems_of(words, parser)]
    assert checked >= 40  # the scan finds the documented commands
    assert not problems, "\n".join(problems)


def test_a_wrong_flag_or_subcommand_is_found() -> None:
    parser = build_parser()
    assert problems_of(["serve", "MODEL", "--tensor-parallel-size", "2"], parser) == []
    assert problems_of(["serve", "--tensor-paralel-size", "2"], parser) == [
        "atlas serve has no option --tensor-paralel-size"
    ]
    assert problems_of(["bench", "--random-weights"], parser) == ["atlas bench has no subcommand --random-weights"]
    assert problems_of(["bench", "latency", "[--batch-size=4]"], parser) == []
