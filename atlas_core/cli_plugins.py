"""``atlas plugins``: list every installed plugin, what it registers, and what failed.

Listing imports each plugin's entry-point module (that is how its hooks are called) but no
registration target, so it is fast and never touches a GPU. ``--check`` additionally imports every
target: backends report their ``availability()``, other targets are checked against their base class.
Broken plugins are shown with ``error:`` lines; the exit status is 0 unless the command itself fails
(with ``ATLAS_PLUGINS_STRICT=1`` a broken plugin raises instead of being listed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from typing import Any

from atlas_core.errors import PluginError
from atlas_core.hookspecs import HOOK_KINDS
from atlas_core.plugins import PluginInfo, PluginRegistry, Registration, load_plugins, normalize_name

KIND_ORDER = list(HOOK_KINDS.values())
"""Registrations are shown grouped by kind, in hook order (`HOOK_KINDS`: backend, model, layer, ...)."""

BASE_CLASSES = {
    "backend": "atlas_core.backends.base:Backend",
    "model": "atlas_core.model.loader:ModelWeightLoader",
    "comm": "atlas_core.comm:CommBackend",
    "op_group": "atlas_core.backends.ops:OpGroup",
    "op_impl": "atlas_core.backends.ops:OpGroup",
}
"""The class a target of each kind must subclass, checked by ``--check`` (kinds absent: any class)."""

TARGET_CHECKS = {
    "tool_parser": "atlas_core.parsing.registry:load_tool_format",
    "reasoning_parser": "atlas_core.parsing.registry:load_reasoning_format",
}
"""Kinds whose targets ``--check`` verifies with this function of the registration (raising
`PluginError`) instead of by base class: what the parsing layer itself runs when it loads them."""


def add_plugins_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``plugins`` subcommand; the parsed namespace's ``handler`` is `run_plugins_command`."""
    parser = subparsers.add_parser(
        "plugins",
        help="list installed plugins and what they register",
        description="List every Atlas plugin found (entry point group 'atlas'), its distribution and "
        "version, the names it registers, and any error it raised while loading.",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also import every registered target; backends report whether they can run here",
    )
    parser.set_defaults(handler=run_plugins_command)
    return parser


def run_plugins_command(args: argparse.Namespace) -> int:
    """Print the plugin listing (text, or JSON with ``args.json``) to stdout; returns the exit status 0."""
    report = plugins_report(load_plugins(), check=args.check)
    if args.json:
        print(json.dumps(report, indent=2, default=repr))
    else:
        print(format_report(report))
    return 0


def plugins_report(registry: PluginRegistry, *, check: bool = False) -> dict[str, Any]:
    """The listing as JSON-ready data (the ``--json`` output).

    ``{"allowlist": [names] | null, "unmatched_allowlist": [names], "plugins": [{"name",
    "distribution", "version", "module", "registrations": [{"kind", "name", "target", "metadata",
    "check"?}], "errors": [str]}], "conflicts": [{"kind", "name", "plugins": [labels], "error"}]}``.
    ``check`` (only when asked) is ``{"status": "ok" | "available" | "unavailable" | "failed",
    "detail": str | null}``. Registrations are sorted by kind in hook order, then registration order.
    ``conflicts`` are names registered by more than one plugin: selecting them fails.
    """
    raw_allowlist = os.environ.get("ATLAS_PLUGINS")
    allowlist = None if raw_allowlist is None else [n.strip() for n in raw_allowlist.split(",") if n.strip()]
    loaded_names = {normalize_name(n) for info in registry.plugins for n in (info.name, info.distribution)}
    return {
        "allowlist": allowlist,
        "unmatched_allowlist": [n for n in allowlist or [] if normalize_name(n) not in loaded_names],
        "plugins": [_plugin_entry(info, check) for info in registry.plugins],
        "conflicts": _conflicts(registry),
    }


def _conflicts(registry: PluginRegistry) -> list[dict[str, Any]]:
    conflicts = []
    for kind in KIND_ORDER:
        for name in registry.names(kind):
            try:
                registry.find(kind, name)
            except PluginError as exc:
                claimants = [r.plugin.label for r in registry.registrations(kind) if r.name == name]
                conflicts.append({"kind": kind, "name": name, "plugins": claimants, "error": str(exc)})
    return conflicts


def _plugin_entry(info: PluginInfo, check: bool) -> dict[str, Any]:
    registrations = sorted(info.registrations, key=lambda r: KIND_ORDER.index(r.kind))
    entries = []
    for registration in registrations:
        entry: dict[str, Any] = {
            "kind": registration.kind,
            "name": registration.name,
            "target": registration.target,
            "metadata": dict(registration.metadata),
        }
        if check:
            entry["check"] = check_registration(registration)
        entries.append(entry)
    return {
        "name": info.name,
        "distribution": info.distribution,
        "version": info.version,
        "module": info.module,
        "registrations": entries,
        "errors": list(info.errors),
    }


def _attribute(path: str) -> Any:
    """The attribute a core ``"module:attribute"`` path names."""
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def check_registration(registration: Registration) -> dict[str, str | None]:
    """Import the target and verify it: never raises, the outcome is in the returned status.

    ``available`` / ``unavailable`` (with the reason) for backends, ``ok`` for other kinds,
    ``failed`` (with the error) when the import fails, the target is not a subclass of its kind's
    base class (or fails its kind's `TARGET_CHECKS` function), or a backend's ``availability()`` raises.
    """
    try:
        target = registration.load()
    except Exception as exc:
        return {"status": "failed", "detail": str(exc)}
    if registration.kind in TARGET_CHECKS:
        try:
            _attribute(TARGET_CHECKS[registration.kind])(registration)
        except PluginError as exc:
            return {"status": "failed", "detail": str(exc)}
        return {"status": "ok", "detail": None}
    base_path = BASE_CLASSES.get(registration.kind)
    if base_path is not None:
        base = _attribute(base_path)
        if not (isinstance(target, type) and issubclass(target, base)):
            return {"status": "failed", "detail": f"{registration.target} is not a subclass of {base_path}"}
    elif not callable(target):
        return {"status": "failed", "detail": f"{registration.target} is not callable"}
    if registration.kind != "backend":
        return {"status": "ok", "detail": None}
    try:
        reason = target.availability()
    except Exception as exc:
        return {"status": "failed", "detail": f"availability() raised {type(exc).__name__}: {exc}"}
    return (
        {"status": "available", "detail": None} if reason is None else {"status": "unavailable", "detail": str(reason)}
    )


def _format_metadata(metadata: dict[str, Any]) -> str:
    if not metadata:
        return ""
    items = ", ".join(f"{key}={json.dumps(value, default=repr)}" for key, value in metadata.items())
    return f" ({items})"


def _format_check(result: dict[str, str | None]) -> str:
    """A passed check as a line suffix (`` [available]``); failures are shown as ``error:`` lines instead."""
    status, detail = result["status"], result["detail"]
    return f"  [{status}: {detail}]" if detail else f"  [{status}]"


def format_report(report: dict[str, Any]) -> str:
    """The human-readable listing: one block per plugin, registrations grouped by kind, then errors."""
    lines = []
    if report["allowlist"] is not None:
        lines += [f"ATLAS_PLUGINS={','.join(report['allowlist'])}: other plugins are not loaded", ""]
    errors = 0
    for plugin in report["plugins"]:
        lines.append(f"{plugin['name']}  {plugin['distribution']} {plugin['version']}")
        for entry in plugin["registrations"]:
            line = f"  {entry['kind']} {entry['name']} -> {entry['target']}{_format_metadata(entry['metadata'])}"
            check = entry.get("check")
            if check is not None and check["status"] == "failed":
                lines += [line, f"  error: {entry['kind']} {entry['name']}: {check['detail']}"]
                errors += 1
                continue
            lines.append(line + (_format_check(check) if check is not None else ""))
        if not plugin["registrations"] and not plugin["errors"]:
            lines.append("  (registers nothing)")
        lines += [f"  error: {error}" for error in plugin["errors"]]
        errors += len(plugin["errors"])
        lines.append("")
    for conflict in report["conflicts"]:
        lines.append(f"error: {conflict['error']}")
        errors += 1
    for name in report["unmatched_allowlist"]:
        lines.append(f"warning: ATLAS_PLUGINS names {name!r}, which matches no installed plugin")
    if report["conflicts"] or report["unmatched_allowlist"]:
        lines.append("")
    count = len(report["plugins"])
    summary = f"{count} plugin{'s' if count != 1 else ''}, "
    summary += f"{errors} error{'s' if errors != 1 else ''} (see 'error:' lines above)" if errors else "no errors"
    return "\n".join(lines + [summary])
