"""Installing throwaway plugins the way pip does, for plugin tests.

A plugin is a module plus a ``<name>-<version>.dist-info`` folder (METADATA + entry_points.txt)
in a folder on ``sys.path``, so discovery goes through the real ``importlib_metadata`` path.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV_VARS = ("ATLAS_PLUGINS", "ATLAS_PLUGINS_STRICT", "ATLAS_TRACE_HOOKS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty site-packages folder on ``sys.path``; modules imported from it are forgotten afterwards."""
    root = tmp_path / "site-packages"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(root)):
            del sys.modules[name]


def install_plugin(
    site: Path, distribution: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> None:
    """Install a distribution into ``site``: ``modules`` (name -> source) and its ``atlas`` entry points."""
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    dist_info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (dist_info / "entry_points.txt").write_text("[atlas]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
