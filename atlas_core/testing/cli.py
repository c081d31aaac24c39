"""``atlas plugins`` run in-process, for tests that check what a plugin registers and how it is listed."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from atlas_core.cli_plugins import add_plugins_parser


def run_plugins(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Parse ``plugins *argv`` with the subcommand's own parser, run it, return stdout (exit status must be 0)."""
    parser = argparse.ArgumentParser(prog="atlas")
    add_plugins_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plugins", *argv])
    assert args.handler(args) == 0
    return capsys.readouterr().out


def by_distribution(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The plugins of an ``atlas plugins --json`` report, by distribution name."""
    return {p["distribution"]: p for p in report["plugins"]}
