"""Op groups as a plug point: a plugin adds a new group and a native implementation for a backend
without touching core; `Backend.ops` resolves the native one, else the host fallback; a broken or
misdeclared implementation falls back (strict mode raises) and never stops the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.backends.op_registry import resolve_op_group
from atlas_core.backends.ops.moe import MoEOps
from atlas_core.backends.select import select_backend
from atlas_core.errors import PluginError
from atlas_core.plugins import load_plugins
from tests.plugin_site import clean_env, install_plugin, site  # noqa: F401 (fixtures)

GROUP_SOURCE = '''
    import numpy as np
    from atlas_core.backends.ops import OpGroup, on_host
    from atlas_core.hookspecs import hookimpl

    def double_reference(x):
        return (np.asarray(x, dtype=np.float32) * 2).astype(np.float32)

    class ToyOps(OpGroup):
        """A third party's op group: one op, ``double(x) = 2 x``."""
        name = "toy"

        def double(self, x):
            return on_host(self.backend, double_reference, x)

    class NativeToyOps(ToyOps):
        native = True

        def double(self, x):
            return x + x

    class NotAToyGroup:
        def __init__(self, backend):
            pass

    @hookimpl
    def register_op_groups(register):
        register("toy", "toy_ops:ToyOps")
'''


def install_toy(site: Path, implementations: dict[str, str]) -> None:
    """The group's plugin, plus one plugin per native implementation target (``name -> target``)."""
    install_plugin(site, "atlas-ops-toy", "1.0", {"toy": "toy_ops"}, {"toy_ops": GROUP_SOURCE})
    for index, (distribution, target) in enumerate(implementations.items()):
        module = f"toy_native_{index}"
        install_plugin(
            site,
            distribution,
            "1.0",
            {module: module},
            {
                module: f'''
            from atlas_core.hookspecs import hookimpl

            @hookimpl
            def register_op_implementations(register):
                register("toy", "{target}", backend="numpy")
        '''
            },
        )


def test_a_plugin_group_runs_through_its_host_fallback(site: Path) -> None:
    install_toy(site, {})
    registry = load_plugins()
    toy = registry.load("op_group", "toy")
    backend = select_backend(registry, "numpy")
    ops = backend.ops(toy)
    assert type(ops) is toy and ops.backend is backend
    np.testing.assert_array_equal(ops.double(np.arange(3, dtype=np.float32)), [0, 2, 4])
    assert backend.ops(toy) is ops  # resolved once per backend


def test_a_registered_native_implementation_is_preferred(site: Path) -> None:
    install_toy(site, {"atlas-toy-numpy": "toy_ops:NativeToyOps"})
    registry = load_plugins()
    toy = registry.load("op_group", "toy")
    ops = select_backend(registry, "numpy").ops(toy)
    assert getattr(ops, "native", False) and isinstance(ops, toy)
    np.testing.assert_array_equal(ops.double(np.ones(2, dtype=np.float32)), [2, 2])
    assert resolve_op_group(registry, "cuda", toy) is toy  # registered for numpy only


def test_an_implementation_of_the_wrong_class_falls_back_or_raises_in_strict_mode(
    site: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install_toy(site, {"atlas-toy-broken": "toy_ops:NotAToyGroup"})
    registry = load_plugins()
    toy = registry.load("op_group", "toy")
    assert type(select_backend(registry, "numpy").ops(toy)) is toy
    assert "must subclass" in caplog.text and "atlas-toy-broken" in caplog.text
    monkeypatch.setenv("ATLAS_PLUGINS_STRICT", "1")
    with pytest.raises(PluginError, match="must subclass"):
        resolve_op_group(registry, "numpy", toy)


def test_an_implementation_that_cannot_be_imported_falls_back(site: Path) -> None:
    install_toy(site, {"atlas-toy-missing": "toy_missing_module:Nothing"})
    registry = load_plugins()
    toy = registry.load("op_group", "toy")
    assert type(select_backend(registry, "numpy").ops(toy)) is toy


def test_two_native_implementations_for_one_backend_are_an_error_naming_both(site: Path) -> None:
    install_toy(site, {"atlas-toy-a": "toy_ops:NativeToyOps", "atlas-toy-b": "toy_ops:NativeToyOps"})
    registry = load_plugins()
    with pytest.raises(PluginError, match="atlas-toy-a 1.0 and atlas-toy-b 1.0"):
        resolve_op_group(registry, "numpy", registry.load("op_group", "toy"))


def test_core_groups_are_registered_and_run_on_the_host_for_numpy() -> None:
    registry = load_plugins()
    assert {"moe", "mla", "gated_delta", "mamba2"} <= set(registry.names("op_group"))
    for name in ("moe", "mla", "gated_delta", "mamba2"):
        group = registry.load("op_group", name)
        assert group.name == name
    assert type(NumpyBackend().ops(MoEOps)) is MoEOps
