"""Registration metadata is typed: each hook accepts the keys `HOOK_METADATA` declares, with their
types; a misspelt key, a value of another type or a missing required key fails that plugin's hook
at registration, naming the plugin and the key, and the other plugins load."""

from __future__ import annotations

from pathlib import Path

import pytest

from atlas_core.cli_plugins import format_report, plugins_report
from atlas_core.errors import PluginError
from atlas_core.hookspecs import HOOK_KINDS, HOOK_METADATA
from atlas_core.plugins import load_plugins
from tests.plugin_site import clean_env, install_plugin, site  # noqa: F401 (fixtures)
from tests.test_plugins import assert_installed_plugins_intact, hook_module, plugin

TYPO = hook_module("""
    @hookimpl
    def register_gpu_backends(register):
        register("typo-gpu", "typo_plugin:Backend", prority=100)

    @hookimpl
    def register_layers(register):
        register("typo_layer", "typo_plugin:Layer")
""")


def install(site: Path, distribution: str, source: str) -> None:
    module = distribution.replace("-", "_")
    install_plugin(site, distribution, "1.0", {distribution: module}, {module: source})


def test_every_hook_declares_its_metadata() -> None:
    assert set(HOOK_METADATA) == set(HOOK_KINDS.values())


def test_a_misspelt_key_fails_only_that_plugins_hook(site: Path) -> None:
    install(site, "typo-plugin", TYPO)
    registry = load_plugins()
    info = plugin(registry, "typo-plugin")
    assert info.errors == [
        "register_gpu_backends failed: PluginError: typo-plugin 1.0 registers backend 'typo-gpu' with the unknown "
        "metadata key 'prority' (accepted: priority (int))"
    ]
    assert [(r.kind, r.name) for r in info.registrations] == [("layer", "typo_layer")]
    assert registry.find("backend", "typo-gpu") is None
    assert_installed_plugins_intact(registry)
    report = format_report(plugins_report(registry))
    assert "  error: register_gpu_backends failed: PluginError: typo-plugin 1.0 registers backend 'typo-gpu'" in report


@pytest.mark.parametrize(
    ("hook", "call", "message"),
    [
        (
            "register_gpu_backends",
            'register("b", "m:B", priority="high")',
            "registers backend 'b' with priority='high'; priority must be of type int: Expected `int`, got `str`",
        ),
        (
            "register_gpu_backends",
            'register("b", "m:B", priority=True)',
            "priority must be of type int: Expected `int`, got `bool`",
        ),
        (
            "register_model_loaders",
            'register("m", "m:L", architectures=["MForCausalLM", 3])',
            "architectures must be of type list[str]: Expected `str`, got `int` - at `$[1]`",
        ),
        (
            "register_model_loaders",
            'register("m", "m:L", defaults="hermes")',
            "defaults must be of type dict[str, Any]",
        ),
        (
            "register_op_implementations",
            'register("moe", "m:NativeMoE")',
            "registers op group implementation 'moe' without the required metadata key 'backend' "
            "(accepted: backend (str))",
        ),
        (
            "register_tool_parsers",
            'register("t", "m:T", models=["x"])',
            "registers tool-call parser 't' with the unknown metadata key 'models' "
            "(register_tool_parsers accepts no metadata)",
        ),
    ],
)
def test_wrong_types_and_missing_keys_are_errors(site: Path, hook: str, call: str, message: str) -> None:
    install(
        site,
        "typed-plugin",
        hook_module(f"""
        @hookimpl
        def {hook}(register):
            {call}
    """),
    )
    [error] = plugin(load_plugins(), "typed-plugin").errors
    assert error.startswith(f"{hook} failed: PluginError: typed-plugin 1.0 registers ") and message in error


def test_strict_mode_reraises_naming_plugin_and_key(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, "typo-plugin", TYPO)
    monkeypatch.setenv("ATLAS_PLUGINS_STRICT", "1")
    with pytest.raises(
        PluginError, match=r"^typo-plugin 1\.0 registers backend 'typo-gpu' with the unknown metadata key 'prority'"
    ):
        load_plugins()
