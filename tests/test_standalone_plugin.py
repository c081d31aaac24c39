"""Plugins are tested as installed packages: no plugin imports core's test suite, and a family plugin's
tests pass in an environment that holds only atlas-core and that plugin.

The second check builds that environment the way a plugin's own CI would, from this repository:
the locked dependencies of the plugin and of its ``test`` group (``uv sync --frozen --offline``, from
uv's cache: nothing is downloaded), then atlas-core and the plugin as freshly built wheels (not
editable, so neither the repository nor core's ``tests`` folder is importable), then runs
``pytest plugins/models/<plugin>`` there with ``python -I``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).parent.parent
PLUGIN_SOURCES = ("plugins/**/*.py", "tests/example_plugin/**/*.py")
"""Every plugin's code and tests (globs relative to the repository)."""
STANDALONE_PLUGIN = ("atlas-model-qwen3", "plugins/models/qwen3")
"""The family plugin whose tests run with only atlas-core beside it: distribution and folder."""


def imports_of(path: Path) -> set[str]:
    """The top-level names of every module that the Python file ``path`` imports (absolute imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_plugin_imports_the_core_test_suite() -> None:
    files = sorted({path for pattern in PLUGIN_SOURCES for path in REPOSITORY.glob(pattern)})
    assert len(files) > 20, files
    offenders = [str(path.relative_to(REPOSITORY)) for path in files if "tests" in imports_of(path)]
    assert offenders == [], f"import atlas_core.testing instead of core's tests package: {offenders}"


def run(
    command: list[str | Path],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command``, failing the test with its output when it exits with an error."""
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd, env=env)
    shown = " ".join(str(part) for part in command)
    assert result.returncode == 0, f"{shown} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return result


@pytest.mark.standalone
def test_a_family_plugin_passes_its_tests_with_only_core_installed(tmp_path: Path) -> None:
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (pip install uv)")
    distribution, folder = STANDALONE_PLUGIN
    venv, wheels = tmp_path / "venv", tmp_path / "wheels"
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ATLAS_", "VIRTUAL_ENV"))}
    uv_env = env | {"UV_PROJECT_ENVIRONMENT": str(venv)}

    run(
        [
            uv,
            "sync",
            "--frozen",
            "--offline",
            "--quiet",
            "--package",
            distribution,
            "--no-default-groups",
            "--group",
            "test",
            "--no-install-workspace",
            "--python",
            sys.executable,
        ],
        cwd=REPOSITORY,
        env=uv_env,
    )
    for source in (REPOSITORY, REPOSITORY / folder):
        run([uv, "build", "--wheel", "--offline", "--quiet", "--out-dir", wheels, source], cwd=REPOSITORY, env=uv_env)
    run(
        [
            uv,
            "pip",
            "install",
            "--offline",
            "--quiet",
            "--no-deps",
            "--python",
            venv / "bin" / "python",
            *sorted(wheels.glob("*.whl")),
        ],
        env=uv_env,
    )

    python: list[str | Path] = [venv / "bin" / "python", "-I"]
    listed = run([*python, "-c", "import importlib.metadata as m; print(*(d.name for d in m.distributions()))"])
    assert sorted(name for name in listed.stdout.split() if name.startswith("atlas")) == ["atlas-core", distribution]
    tests = run(
        [*python, "-m", "pytest", "-q", "-p", "no:cacheprovider", REPOSITORY / folder],
        cwd=tmp_path,
        env=env | {"ATLAS_PLUGINS_STRICT": "1"},
    )
    summary = tests.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed in [\d.]+s( \([\d:]+\))?", summary), tests.stdout
