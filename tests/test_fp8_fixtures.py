"""The committed tiny FP8 checkpoints (``plugins/models/*/tests/fixtures/fp8``) are exactly what
``scripts/make_fp8_checkpoints.py`` makes from the tiny reference checkpoints, READMEs included, and stay
small."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parent.parent
MAX_FIXTURE_BYTES = 512 * 1024


def generator() -> ModuleType:
    path = REPOSITORY / "scripts" / "make_fp8_checkpoints.py"
    spec = importlib.util.spec_from_file_location("make_fp8_checkpoints", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_fixtures_are_what_the_generator_makes() -> None:
    assert generator().stale_files() == [], "run: uv run python scripts/make_fp8_checkpoints.py"


def test_fixtures_are_small() -> None:
    for spec in generator().SPECS:
        size = sum(f.stat().st_size for f in spec.folder.iterdir())
        assert size <= MAX_FIXTURE_BYTES, f"{spec.folder}: {size} bytes"
