"""The ``atlas`` command as a user runs it (subprocesses, default model, no network)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import TINY


def atlas(*args: str, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atlas_core.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_version() -> None:
    result = atlas("--version")
    assert result.returncode == 0 and result.stdout.startswith("atlas ")


def test_generate_chat_on_the_default_model(default_llm: object) -> None:
    result = atlas("generate", "--chat", "What is the capital of France?", "--max-tokens", "24")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_interactive_chat_on_the_default_model(default_llm: object) -> None:
    result = atlas("chat", "--max-tokens", "24", stdin="What is the capital of France?\n\n")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_generate_on_a_folder_without_tokenizer_is_a_clear_error() -> None:
    result = atlas("generate", str(TINY / "llama"), "hello")
    assert result.returncode == 2
    assert "has no tokenizer (tokenizer.json or tokenizer.model)" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["generate", "/no/such/model", "hi"], ["serve", "/no/such/model"]])
def test_bad_model_path_is_one_line_not_a_traceback(args: list[str]) -> None:
    result = atlas(*args)
    assert result.returncode == 2
    assert "no such model folder or .gguf file" in result.stderr and "Traceback" not in result.stderr
