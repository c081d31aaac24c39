"""The code gates: ``ruff check``, ``ruff format --check`` and ``mypy`` report nothing on the repository.

Each runs as ``python -m <tool>`` with this interpreter (the ``test`` dependency group installs the
tools and the stub packages mypy needs) from the repository root, so it reads the settings in the root
``pyproject.toml`` (``[tool.ruff]``, ``[tool.mypy]``) exactly as a developer's run does. A failure shows
the tool's own report. mypy keeps its incremental cache in ``.mypy_cache``: a first run takes seconds,
later ones less.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GATES = {
    "ruff check": ["ruff", "check", "--no-fix", "."],
    "ruff format": ["ruff", "format", "--check", "."],
    "mypy": ["mypy"],
}
"""Gate name -> the module and arguments run as ``python -m``; each exits 0 only when it reports nothing."""


@pytest.mark.parametrize("gate", list(GATES))
def test_gate_is_clean(gate: str) -> None:
    """The gate exits 0; otherwise the test fails with the command and everything it printed."""
    command = [sys.executable, "-m", *GATES[gate]]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(
            f"{gate} reported problems (exit status {result.returncode}); run `{' '.join(GATES[gate])}` "
            f"from the repository root to see and fix them:\n{result.stdout}{result.stderr}",
            pytrace=False,
        )
