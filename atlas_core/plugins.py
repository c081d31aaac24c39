"""Plugin discovery and the registry of everything plugins register.

Discovery reads entry points of the ``atlas`` group from installed distributions and registers
each module with a pluggy ``PluginManager``; then every registration hook of every plugin is
called, one plugin at a time, so each registration is attributed to its distribution and a
failing plugin is reported and skipped without affecting the others.

Environment variables:
  ``ATLAS_PLUGINS``         comma-separated entry-point or distribution names to load (unset: all);
                            compared case-insensitively, with ``-``, ``_`` and ``.`` alike.
                            Core's built-in registrations are always loaded.
  ``ATLAS_PLUGINS_STRICT``  ``1``: a plugin that fails to load or register re-raises instead.
  ``ATLAS_TRACE_HOOKS``     ``1``: print every hook call to stderr (pluggy tracing).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import importlib_metadata
import msgspec
import pluggy

from atlas_core import hookspecs
from atlas_core.errors import PluginError

ENTRY_POINT_GROUP = "atlas"
KIND_LABELS = {
    "backend": "backend",
    "model": "model family",
    "layer": "layer type",
    "comm": "comm backend",
    "storage": "storage backend",
    "op_group": "op group",
    "op_impl": "op group implementation",
    "tool_parser": "tool-call parser",
    "reasoning_parser": "reasoning parser",
}


@dataclass(frozen=True)
class Registration:
    """One ``register(name, target, **metadata)`` call made by a plugin's hook."""

    kind: str
    name: str
    target: str
    plugin: PluginInfo
    metadata: dict[str, Any]

    def load(self) -> Any:
        """Import and return the target; failures raise `PluginError` naming the plugin."""
        module_name, _, attribute = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except Exception as exc:
            raise PluginError(
                f"{KIND_LABELS[self.kind]} {self.name!r} from {self.plugin.label} cannot be "
                f"imported ({self.target}): {type(exc).__name__}: {exc}"
            ) from exc


@dataclass(eq=False)
class PluginInfo:
    """A loaded (or failed) plugin and what it registered."""

    name: str
    distribution: str
    version: str
    module: str
    registrations: list[Registration] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}"


class PluginRegistry:
    """Every plugin found and every name registered, queried by (kind, name)."""

    def __init__(self, plugins: list[PluginInfo]) -> None:
        self.plugins = plugins

    def registrations(self, kind: str) -> list[Registration]:
        return [r for p in self.plugins for r in p.registrations if r.kind == kind]

    def names(self, kind: str) -> list[str]:
        return sorted({r.name for r in self.registrations(kind)})

    def find(self, kind: str, name: str) -> Registration | None:
        """The registration of ``name``, None if absent; two claimants raise `PluginError`."""
        claimants = [r for r in self.registrations(kind) if r.name == name]
        if len(claimants) > 1:
            owners = " and ".join(r.plugin.label for r in claimants)
            raise PluginError(
                f"{KIND_LABELS[kind]} {name!r} is registered by both {owners}; uninstall one, or "
                f"set ATLAS_PLUGINS to the plugins to load (e.g. ATLAS_PLUGINS="
                f"{claimants[0].plugin.name})"
            )
        return claimants[0] if claimants else None

    def get(self, kind: str, name: str) -> Registration:
        """Like `find`, but an unknown name raises `PluginError` listing the known ones."""
        registration = self.find(kind, name)
        if registration is None:
            known = ", ".join(self.names(kind)) or "none"
            raise PluginError(f"no {KIND_LABELS[kind]} named {name!r} is installed (installed: {known})")
        return registration

    def load(self, kind: str, name: str) -> Any:
        return self.get(kind, name).load()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def strict_mode() -> bool:
    """Whether ``ATLAS_PLUGINS_STRICT`` asks for plugin failures to raise instead of being skipped."""
    return _env_flag("ATLAS_PLUGINS_STRICT")


def normalize_name(name: str) -> str:
    """A distribution or entry-point name compared the way pip compares names (PEP 503):
    ``Atlas_Model.Llama`` and ``atlas-model-llama`` are the same."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _allowlist() -> set[str] | None:
    raw = os.environ.get("ATLAS_PLUGINS")
    if raw is None:
        return None
    return {normalize_name(item.strip()) for item in raw.split(",") if item.strip()}


def _make_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    if _env_flag("ATLAS_TRACE_HOOKS"):
        manager.trace.root.setwriter(sys.stderr.write)
        manager.enable_tracing()
    return manager


def _type_name(expected: Any) -> str:
    return expected.__name__ if isinstance(expected, type) else repr(expected).replace("typing.", "")


def check_metadata(hook_name: str, registering: str, metadata: dict[str, Any]) -> None:
    """Raise `PluginError` unless ``metadata`` has only keys the hook accepts (`hookspecs.HOOK_METADATA`),
    every required one, each value of its declared type. ``registering`` opens the message
    (``"atlas-foo 1.0 registers backend 'x'"``), which then names the key and lists the accepted ones."""
    accepted = hookspecs.HOOK_METADATA.get(hookspecs.HOOK_KINDS[hook_name], {})
    listing = ", ".join(f"{key} ({_type_name(spec.type)})" for key, spec in accepted.items())
    listing = f"accepted: {listing}" if listing else f"{hook_name} accepts no metadata"
    for key, value in metadata.items():
        if key not in accepted:
            raise PluginError(f"{registering} with the unknown metadata key {key!r} ({listing})")
        try:
            msgspec.convert(value, accepted[key].type, strict=True)
        except msgspec.ValidationError as exc:
            raise PluginError(
                f"{registering} with {key}={value!r}; {key} must be of type {_type_name(accepted[key].type)}: {exc}"
            ) from None
    missing = [key for key, spec in accepted.items() if spec.required and key not in metadata]
    if missing:
        raise PluginError(f"{registering} without the required metadata key {missing[0]!r} ({listing})")


def _registrar(hook_name: str, kind: str, info: PluginInfo, found: list[Registration]) -> hookspecs.Register:
    """The ``register`` callable handed to one plugin's ``hook_name`` hook: it validates each registration
    (a non-empty name, a ``"module:Attribute"`` target, metadata per `check_metadata`) and appends it to
    ``found``; it raises `PluginError` for an invalid one."""

    def register(name: str, target: str, **metadata: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"registered name must be a non-empty string, got {name!r}")
        module_part, sep, attribute = str(target).partition(":")
        if not sep or not module_part or not attribute:
            raise PluginError(f"target for {name!r} must look like 'package.module:Attribute', got {target!r}")
        check_metadata(hook_name, f"{info.label} registers {KIND_LABELS[kind]} {name!r}", metadata)
        found.append(Registration(kind, name, target, info, dict(metadata)))

    return register


def _collect(manager: pluggy.PluginManager, module: ModuleType, info: PluginInfo, strict: bool) -> None:
    """Call each registration hook of one plugin, recording what it registers."""
    others = [p for p in manager.get_plugins() if p is not module]
    for hook_name, kind in hookspecs.HOOK_KINDS.items():
        found: list[Registration] = []
        register = _registrar(hook_name, kind, info, found)
        try:
            manager.subset_hook_caller(hook_name, remove_plugins=others)(register=register)
        except Exception as exc:
            if strict:
                raise
            info.errors.append(f"{hook_name} failed: {type(exc).__name__}: {exc}")
            continue
        info.registrations.extend(found)


def _builtin_info() -> PluginInfo:
    from atlas_core.version import __version__

    return PluginInfo(
        name="atlas-core", distribution="atlas-core", version=__version__, module="atlas_core.builtin_plugin"
    )


def load_plugins(entry_points: Iterable[importlib_metadata.EntryPoint] | None = None) -> PluginRegistry:
    """Discover, import and query every plugin; never raises for one plugin's failure unless strict."""
    strict = strict_mode()
    allow = _allowlist()
    manager = _make_manager()
    loaded: list[tuple[ModuleType, PluginInfo]] = []

    builtin = importlib.import_module("atlas_core.builtin_plugin")
    manager.register(builtin, name="atlas-core")
    loaded.append((builtin, _builtin_info()))

    failed: list[PluginInfo] = []
    points = importlib_metadata.entry_points(group=ENTRY_POINT_GROUP) if entry_points is None else entry_points
    for point in points:
        dist = point.dist
        info = PluginInfo(
            name=point.name,
            distribution=dist.name if dist else "unknown",
            version=dist.version if dist else "?",
            module=point.value,
        )
        if allow is not None and not {normalize_name(point.name), normalize_name(info.distribution)} & allow:
            continue
        try:
            module = point.load()
            manager.register(module, name=f"{info.distribution}:{point.name}")
            manager.check_pending()
        except Exception as exc:
            if strict:
                raise
            info.errors.append(f"import failed: {type(exc).__name__}: {exc}")
            failed.append(info)
            if module_registered := manager.get_plugin(f"{info.distribution}:{point.name}"):
                manager.unregister(module_registered)
            continue
        loaded.append((module, info))

    for module, info in loaded:
        _collect(manager, module, info, strict)
    return PluginRegistry([info for _, info in loaded] + failed)


@functools.cache
def get_registry() -> PluginRegistry:
    """The process-wide registry, built on first use."""
    return load_plugins()
