"""``atlas plugins``: the text listing, ``--json``, ``--check``, and how broken plugins are shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from atlas_core.testing.cli import by_distribution, run_plugins
from tests.plugin_site import clean_env, install_plugin, site  # noqa: F401 (fixtures)

INSTALLED = {
    "atlas-core": ("atlas-core", "0.1.0"),
    "atlas-model-llama": ("llama", "0.1.0"),
    "atlas-model-qwen3": ("qwen3", "0.1.0"),
    "atlas-example-plugin": ("example", "0.0.1"),
}
EXAMPLE_BLOCK = [
    "example  atlas-example-plugin 0.0.1",
    "  backend example-numpy -> atlas_example_plugin.backend:CountingNumpyBackend (priority=-10)",
    "  backend example-graphs -> atlas_example_plugin.backend:GraphsNumpyBackend (priority=-20)",
    "  model example_llama -> atlas_example_plugin.loader:ExampleLlamaLoader "
    '(architectures=["ExampleLlamaForCausalLM"])',
    "  layer example_rms_norm -> atlas_example_plugin.layers:CountingRMSNorm",
    "  comm example-recording -> atlas_example_plugin.comm:RecordingComm",
    "  tool_parser example_calls -> atlas_example_plugin.parsers:ExampleCallFormat",
    "  reasoning_parser example_thoughts -> atlas_example_plugin.parsers:EXAMPLE_THOUGHTS",
    "",
]


def install(site: Path, distribution: str, entry_point: str, source: str, extra: dict[str, str] | None = None) -> None:
    """Install ``distribution`` 1.0 with one entry point to module ``<entry_point>_plugin`` plus ``extra`` modules."""
    module = f"{entry_point}_plugin"
    install_plugin(site, distribution, "1.0", {entry_point: module}, {module: source, **(extra or {})})


def test_text_listing_shows_every_installed_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_plugins(capsys).splitlines()
    for distribution, (name, version) in INSTALLED.items():
        assert f"{name}  {distribution} {version}" in lines
    assert "  backend numpy -> atlas_core.backends.numpy_backend:NumpyBackend (priority=0)" in lines
    assert '  model llama -> atlas_model_llama.loader:LlamaLoader (architectures=["LlamaForCausalLM"])' in lines
    assert any(line.startswith("  model qwen3 -> atlas_model_qwen3.loader:Qwen3Loader (") for line in lines)
    start = lines.index(EXAMPLE_BLOCK[0])
    assert lines[start : start + len(EXAMPLE_BLOCK)] == EXAMPLE_BLOCK
    assert not any("error" in line for line in lines[:-1])
    count, summary = lines[-1].split(" ", 1)
    assert summary == "plugins, no errors" and int(count) >= len(INSTALLED), lines[-1]


def test_json_structure(capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads(run_plugins(capsys, "--json"))
    assert set(report) == {"allowlist", "unmatched_allowlist", "plugins", "conflicts"}
    assert (report["allowlist"], report["unmatched_allowlist"], report["conflicts"]) == (None, [], [])
    plugins = by_distribution(report)
    assert INSTALLED.items() <= {d: (p["name"], p["version"]) for d, p in plugins.items()}.items()
    example = plugins["atlas-example-plugin"]
    assert (example["module"], example["errors"]) == ("atlas_example_plugin", [])
    assert example["registrations"][0] == {
        "kind": "backend",
        "name": "example-numpy",
        "target": "atlas_example_plugin.backend:CountingNumpyBackend",
        "metadata": {"priority": -10},
    }
    assert [(r["kind"], r["name"]) for r in example["registrations"]] == [
        ("backend", "example-numpy"),
        ("backend", "example-graphs"),
        ("model", "example_llama"),
        ("layer", "example_rms_norm"),
        ("comm", "example-recording"),
        ("tool_parser", "example_calls"),
        ("reasoning_parser", "example_thoughts"),
    ]
    assert plugins["atlas-model-qwen3"]["registrations"][0]["metadata"]["defaults"]["tool_call_parser"] == "hermes"


def test_check_imports_every_target(capsys: pytest.CaptureFixture[str]) -> None:
    plugins = by_distribution(json.loads(run_plugins(capsys, "--check", "--json")))
    checks = {(r["kind"], r["name"]): r["check"] for p in plugins.values() for r in p["registrations"]}
    assert (
        checks[("backend", "numpy")] == checks[("backend", "example-numpy")] == {"status": "available", "detail": None}
    )
    for key in [
        ("model", "llama"),
        ("model", "qwen3"),
        ("model", "example_llama"),
        ("layer", "example_rms_norm"),
        ("comm", "single"),
        ("comm", "example-recording"),
        ("tool_parser", "hermes"),
        ("tool_parser", "example_calls"),
        ("reasoning_parser", "qwen3"),
        ("reasoning_parser", "example_thoughts"),
    ]:
        assert checks[key] == {"status": "ok", "detail": None}, key

    lines = run_plugins(capsys, "--check").splitlines()
    assert "  backend numpy -> atlas_core.backends.numpy_backend:NumpyBackend (priority=0)  [available]" in lines
    assert "  comm example-recording -> atlas_example_plugin.comm:RecordingComm  [ok]" in lines


def test_broken_plugins_are_listed_with_error_lines(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    healthy = int(run_plugins(capsys).splitlines()[-1].split()[0])
    install(site, "atlas-broken", "broken", 'raise RuntimeError("boom at import")\n')
    install(
        site,
        "atlas-fork",
        "fork",
        """
        from atlas_core.hookspecs import hookimpl

        @hookimpl
        def register_model_loaders(register):
            register("llama", "fork_plugin:NotALoader")

        class NotALoader:
            pass
    """,
    )
    lines = run_plugins(capsys).splitlines()
    start = lines.index("broken  atlas-broken 1.0")
    assert lines[start + 1] == "  error: import failed: RuntimeError: boom at import"
    conflict = [line for line in lines if line.startswith("error: model family 'llama' is registered by both")]
    assert len(conflict) == 1 and "atlas-model-llama 0.1.0" in conflict[0] and "atlas-fork 1.0" in conflict[0]
    assert lines[-1] == f"{healthy + 2} plugins, 2 errors (see 'error:' lines above)"
    assert "example  atlas-example-plugin 0.0.1" in lines

    report = json.loads(run_plugins(capsys, "--json"))
    assert by_distribution(report)["atlas-broken"]["errors"] == ["import failed: RuntimeError: boom at import"]
    assert [(c["kind"], c["name"], sorted(c["plugins"])) for c in report["conflicts"]] == [
        ("model", "llama", ["atlas-fork 1.0", "atlas-model-llama 0.1.0"]),
    ]


def test_check_reports_targets_that_do_not_load(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = run_plugins(capsys, "--check").splitlines()[-1].split()
    healthy, errors = int(before[0]), int(before[2]) if before[2] != "no" else 0
    install(
        site,
        "atlas-shaky",
        "shaky",
        """
        from atlas_core.hookspecs import hookimpl

        @hookimpl
        def register_gpu_backends(register):
            register("missing-lib", "shaky_backend:Backend", priority=50)

        @hookimpl
        def register_model_loaders(register):
            register("not_a_loader", "shaky_plugin:NotALoader")

        class NotALoader:
            pass
    """,
        extra={"shaky_backend": 'raise ImportError("no module named cupy")\n'},
    )
    lines = run_plugins(capsys, "--check").splitlines()
    start = lines.index("shaky  atlas-shaky 1.0")
    assert lines[start + 1] == "  backend missing-lib -> shaky_backend:Backend (priority=50)"
    assert lines[start + 2].startswith(
        "  error: backend missing-lib: backend 'missing-lib' from atlas-shaky 1.0 cannot be imported"
    )
    assert lines[start + 2].endswith("ImportError: no module named cupy")
    assert lines[start + 4] == (
        "  error: model not_a_loader: shaky_plugin:NotALoader "
        "is not a subclass of atlas_core.model.loader:ModelWeightLoader"
    )
    assert lines[-1] == f"{healthy + 1} plugins, {errors + 2} errors (see 'error:' lines above)"


def test_allowlist_is_shown(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ATLAS_PLUGINS", "llama,atlas-modle-qwen3")
    lines = run_plugins(capsys).splitlines()
    assert lines[0] == "ATLAS_PLUGINS=llama,atlas-modle-qwen3: other plugins are not loaded"
    assert "warning: ATLAS_PLUGINS names 'atlas-modle-qwen3', which matches no installed plugin" in lines
    assert "qwen3  atlas-model-qwen3 0.1.0" not in lines and "llama  atlas-model-llama 0.1.0" in lines
    assert lines[-1] == "2 plugins, no errors"


def test_atlas_main_dispatches_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    from atlas_core.cli import main

    assert main(["plugins"]) == 0
    assert EXAMPLE_BLOCK[0] in capsys.readouterr().out.splitlines()


def test_python_m_atlas_core_cli_plugins_json() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "atlas_core.cli", "plugins", "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    plugins = by_distribution(json.loads(result.stdout))
    assert INSTALLED.items() <= {d: (p["name"], p["version"]) for d, p in plugins.items()}.items()
    assert all(p["errors"] == [] for p in plugins.values())
