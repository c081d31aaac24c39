"""Plugin discovery end to end: the installed example plugin, the allowlist, failure isolation,
duplicate names, lazy targets and hook tracing.

Fake third-party plugins are installed the way pip installs them: a module plus a
``<name>-<version>.dist-info`` folder (METADATA + entry_points.txt) in a folder on ``sys.path``,
so discovery goes through the real ``importlib_metadata.entry_points`` path.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import importlib_metadata
import numpy as np
import pytest

from atlas_core.errors import PluginError
from atlas_core.hookspecs import HOOK_KINDS
from atlas_core.plugins import PluginInfo, PluginRegistry, load_plugins
from tests.plugin_site import ENV_VARS, clean_env, install_plugin, site  # noqa: F401 (fixtures)

EXAMPLE_PLUGIN = Path(__file__).parent / "example_plugin"


def hook_module(body: str) -> str:
    """Source of a plugin module: the hook marker import plus ``body``."""
    return "from atlas_core.hookspecs import hookimpl\n" + textwrap.dedent(body)


def plugin(registry: PluginRegistry, distribution: str) -> PluginInfo:
    matches = [p for p in registry.plugins if p.distribution == distribution]
    assert len(matches) == 1, [p.label for p in registry.plugins]
    return matches[0]


def assert_installed_plugins_intact(registry: PluginRegistry) -> None:
    for distribution in ("atlas-core", "atlas-model-llama", "atlas-model-qwen3", "atlas-example-plugin"):
        assert plugin(registry, distribution).errors == []
    assert {"llama", "mistral", "qwen2", "qwen3", "example_llama"} <= set(registry.names("model"))
    assert {"numpy", "example-numpy"} <= set(registry.names("backend"))


# ---- (a) the installed third-party example plugin -------------------------------------------------


def test_example_plugin_is_discovered_with_distribution_and_registrations() -> None:
    info = plugin(load_plugins(), "atlas-example-plugin")
    assert (info.name, info.module, info.errors) == ("example", "atlas_example_plugin", [])
    assert info.version == importlib_metadata.version("atlas-example-plugin") == "0.0.1"
    assert {(r.kind, r.name, r.target) for r in info.registrations} == {
        ("backend", "example-numpy", "atlas_example_plugin.backend:CountingNumpyBackend"),
        ("backend", "example-graphs", "atlas_example_plugin.backend:GraphsNumpyBackend"),
        ("model", "example_llama", "atlas_example_plugin.loader:ExampleLlamaLoader"),
        ("layer", "example_rms_norm", "atlas_example_plugin.layers:CountingRMSNorm"),
        ("comm", "example-recording", "atlas_example_plugin.comm:RecordingComm"),
        ("tool_parser", "example_calls", "atlas_example_plugin.parsers:ExampleCallFormat"),
        ("reasoning_parser", "example_thoughts", "atlas_example_plugin.parsers:EXAMPLE_THOUGHTS"),
    }
    backend = next(r for r in info.registrations if r.kind == "backend")
    assert backend.metadata == {"priority": -10}
    assert all(r.plugin is info for r in info.registrations)


def test_example_backend_is_selected_by_name_and_runs_ops() -> None:
    from atlas_core.backends.select import select_backend

    backend = select_backend(load_plugins(), "example-numpy")
    assert type(backend).name == "example-numpy"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = backend.from_numpy(np.eye(3, dtype=np.float32)[::-1], weight=True)
    np.testing.assert_array_equal(backend.to_numpy(backend.linear(x, w)), x[:, ::-1])
    assert backend.argmax(x).tolist() == [2, 2]
    assert backend.op_calls == {"linear": 1, "argmax": 1}


def test_example_backend_never_wins_automatic_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas_core.backends.select import select_backend

    monkeypatch.setenv("ATLAS_PLUGINS", "atlas-example-plugin")
    registry = load_plugins()
    assert registry.names("backend") == ["example-graphs", "example-numpy", "numpy"]
    assert type(select_backend(registry)).name == "numpy"


def test_example_comm_backend_loads_and_records() -> None:
    from atlas_core.comm import CommBackend

    comm_class = load_plugins().load("comm", "example-recording")
    assert issubclass(comm_class, CommBackend)
    comm = comm_class()
    x = np.ones(3)
    assert comm.all_reduce(x) is x and comm.broadcast(x) is x
    assert (comm.rank, comm.world_size, comm.calls) == (0, 1, ["all_reduce", "broadcast"])


def test_example_parsers_pass_the_checks_of_every_format() -> None:
    from atlas_core.parsing import OutputParser
    from atlas_core.testing.grammars import check_plugin_tool_format
    from atlas_core.testing.parsers import TOOLS

    check_plugin_tool_format("example_calls", "atlas-example-plugin", '<|call|>get_time{"zone": "UTC"}<|end|>')
    message = OutputParser.parse(
        "<|thinking|>Rome.<|/thinking|>Sure.", reasoning_parser="example_thoughts", tools=TOOLS
    )
    assert (message.reasoning, message.content) == ("Rome.", "Sure.")


# ---- (b) the ATLAS_PLUGINS allowlist ----------------------------------------------------------------


@pytest.mark.parametrize("allow", ["atlas-model-llama", "llama", "Atlas_Model_Llama", " llama , "])
def test_allowlist_loads_only_named_plugin_and_core(monkeypatch: pytest.MonkeyPatch, allow: str) -> None:
    monkeypatch.setenv("ATLAS_PLUGINS", allow)
    registry = load_plugins()
    assert [p.distribution for p in registry.plugins] == ["atlas-core", "atlas-model-llama"]
    assert registry.names("model") == ["llama", "mistral", "qwen2"]
    assert registry.names("backend") == ["numpy"]


def test_allowlist_with_several_names_and_no_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATLAS_PLUGINS", "example,atlas-model-qwen3")
    assert {p.distribution for p in load_plugins().plugins} == {
        "atlas-core",
        "atlas-example-plugin",
        "atlas-model-qwen3",
    }
    monkeypatch.setenv("ATLAS_PLUGINS", "no-such-plugin")
    assert [p.distribution for p in load_plugins().plugins] == ["atlas-core"]


# ---- (c) broken plugins are reported and skipped ----------------------------------------------------


BROKEN_PLUGINS = {
    "broken-import": ("broken_import_plugin", 'raise RuntimeError("boom at import")\n'),
    "broken-hook": (
        "broken_hook_plugin",
        hook_module("""
            @hookimpl
            def register_model_loaders(register):
                register("half_registered", "broken_hook_plugin:Loader")
                raise ValueError("hook exploded")

            @hookimpl
            def register_layers(register):
                register("surviving_layer", "broken_hook_plugin:Layer")
        """),
    ),
    "broken-target": (
        "broken_target_plugin",
        hook_module("""
            @hookimpl
            def register_gpu_backends(register):
                register("no-colon", "broken_target_plugin.Backend")
        """),
    ),
    "broken-hookname": (
        "broken_hookname_plugin",
        hook_module("""
            @hookimpl
            def register_gpu_backend(register):  # typo: not an Atlas hook
                register("typo", "broken_hookname_plugin:Backend")
        """),
    ),
}


def install_broken(site: Path, *which: str) -> None:
    for distribution in which:
        module, source = BROKEN_PLUGINS[distribution]
        install_plugin(site, distribution, "1.0", {distribution.removeprefix("broken-"): module}, {module: source})


def test_broken_plugins_are_reported_and_skipped(site: Path) -> None:
    install_broken(site, *BROKEN_PLUGINS)
    registry = load_plugins()

    import_error = plugin(registry, "broken-import")
    assert (import_error.registrations, import_error.errors) == ([], ["import failed: RuntimeError: boom at import"])

    hook_error = plugin(registry, "broken-hook")
    assert hook_error.errors == ["register_model_loaders failed: ValueError: hook exploded"]
    assert [(r.kind, r.name) for r in hook_error.registrations] == [("layer", "surviving_layer")]
    assert registry.find("model", "half_registered") is None

    bad_target = plugin(registry, "broken-target")
    assert bad_target.registrations == []
    [error] = bad_target.errors
    assert error.startswith("register_gpu_backends failed: PluginError") and "'no-colon'" in error
    assert "'package.module:Attribute'" in error

    [typo_error] = plugin(registry, "broken-hookname").errors
    assert typo_error.startswith("import failed: PluginValidationError") and "register_gpu_backend" in typo_error
    assert registry.find("backend", "typo") is None

    assert_installed_plugins_intact(registry)


@pytest.mark.parametrize(
    ("distribution", "error", "message"),
    [
        ("broken-import", RuntimeError, "boom at import"),
        ("broken-hook", ValueError, "hook exploded"),
        ("broken-target", PluginError, "package.module:Attribute"),
    ],
)
def test_strict_mode_reraises(
    site: Path, monkeypatch: pytest.MonkeyPatch, distribution: str, error: type[Exception], message: str
) -> None:
    install_broken(site, distribution)
    monkeypatch.setenv("ATLAS_PLUGINS_STRICT", "1")
    with pytest.raises(error, match=message):
        load_plugins()


# ---- (d) the same name from two plugins -----------------------------------------------------------------


def test_duplicate_name_raises_naming_both_distributions(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_plugin(
        site,
        "atlas-model-llama-fork",
        "2.0",
        {"llama_fork": "llama_fork_plugin"},
        {
            "llama_fork_plugin": hook_module("""
            @hookimpl
            def register_model_loaders(register):
                register("llama", "llama_fork_plugin:ForkLoader")
                register("llama_fork_only", "llama_fork_plugin:ForkLoader")
        """),
        },
    )
    registry = load_plugins()
    for lookup in (registry.find, registry.get):
        with pytest.raises(PluginError) as raised:
            lookup("model", "llama")
        assert "atlas-model-llama 0.1.0" in str(raised.value) and "atlas-model-llama-fork 2.0" in str(raised.value)
    assert registry.get("model", "mistral").plugin.distribution == "atlas-model-llama"
    assert registry.get("model", "qwen3").plugin.distribution == "atlas-model-qwen3"
    assert registry.get("model", "llama_fork_only").plugin.distribution == "atlas-model-llama-fork"

    monkeypatch.setenv("ATLAS_PLUGINS", "atlas-model-llama-fork")
    assert load_plugins().get("model", "llama").target == "llama_fork_plugin:ForkLoader"


# ---- (e) listing never imports registration targets -----------------------------------------------------


def test_listing_does_not_import_targets(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas_core.backends.select import select_backend

    install_plugin(
        site,
        "atlas-backend-heavy",
        "0.3",
        {"heavy": "heavy_plugin"},
        {
            "heavy_plugin": hook_module("""
            @hookimpl
            def register_gpu_backends(register):
                register("heavy", "heavy_backend:HeavyBackend", priority=100)
        """),
            "heavy_backend": 'raise ImportError("needs a GPU library that is not installed")\n',
        },
    )
    registry = load_plugins()
    info = plugin(registry, "atlas-backend-heavy")
    assert info.errors == [] and [r.name for r in info.registrations] == ["heavy"]
    assert "heavy_backend" not in sys.modules

    with pytest.raises(PluginError, match=r"'heavy' from atlas-backend-heavy 0\.3 .*needs a GPU library"):
        registry.get("backend", "heavy").load()

    monkeypatch.setenv("ATLAS_PLUGINS", "atlas-backend-heavy")
    assert type(select_backend(load_plugins())).name == "numpy", "a broken candidate is skipped by automatic selection"


def test_loading_the_registry_imports_no_target_module() -> None:
    code = textwrap.dedent("""
        import json, sys
        from atlas_core.plugins import load_plugins
        registry = load_plugins()
        targets = {r.target.partition(":")[0] for p in registry.plugins for r in p.registrations}
        print(json.dumps({"imported": sorted(targets & set(sys.modules)), "numpy": "numpy" in sys.modules,
                          "count": len(targets)}))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert report["count"] >= 8, report
    assert report == {"imported": [], "numpy": False, "count": report["count"]}


# ---- (f) hook tracing -----------------------------------------------------------------------------------


def test_trace_hooks_prints_hook_calls_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    load_plugins()
    assert capsys.readouterr().err == ""

    monkeypatch.setenv("ATLAS_TRACE_HOOKS", "1")
    load_plugins()
    err = capsys.readouterr().err
    for hook in HOOK_KINDS:
        assert f"finish {hook}" in err


# ---- docs/plugin-hooks.md shows the example plugin's real code ------------------------------------------


DOC_BLOCK = re.compile(r"```(python|toml)\n# (\S+)( \(excerpt\))?\n(.*?)```", re.DOTALL)


def test_plugin_doc_examples_match_the_example_plugin() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "plugin-hooks.md").read_text()
    blocks = DOC_BLOCK.findall(doc)
    shown = {path for _, path, excerpt, _ in blocks if not excerpt}
    assert shown == {
        f"atlas_example_plugin/{name}.py" for name in ("__init__", "backend", "loader", "layers", "comm", "parsers")
    }
    for language, path, excerpt, body in blocks:
        source = (EXAMPLE_PLUGIN / path).read_text()
        if not excerpt:
            assert body == source, f"docs/plugin-hooks.md shows an outdated {path}"
            continue
        for chunk in body.split("\n\n\n" if language == "python" else "\n\n"):
            assert chunk.strip() in source, f"docs/plugin-hooks.md: excerpt of {path} not in the file:\n{chunk}"
