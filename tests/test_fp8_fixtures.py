"""The committed tiny FP8 checkpoints (``plugins/models/*/tests/fixtures/fp8``) are exactly what
``scripts/make_fp8_checkpoints.py`` makes from the tiny reference checkpoints, READMEs included, and stay
small."""

from __future__ import annotations

from types import ModuleType

from tests.scripts_loader import load_script

MAX_FIXTURE_BYTES = 512 * 1024


def generator() -> ModuleType:
    return load_script("make_fp8_checkpoints")


def test_fixtures_are_what_the_generator_makes() -> None:
    assert generator().stale_files() == [], "run: uv run python scripts/make_fp8_checkpoints.py"


def test_fixtures_are_small() -> None:
    for spec in generator().SPECS:
        size = sum(f.stat().st_size for f in spec.folder.iterdir())
        assert size <= MAX_FIXTURE_BYTES, f"{spec.folder}: {size} bytes"
