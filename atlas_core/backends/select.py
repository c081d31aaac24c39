"""Choosing the backend: by name, or the highest-priority one that is available here."""

from __future__ import annotations

from atlas_core.backends.base import Backend
from atlas_core.errors import BackendUnavailableError, PluginError
from atlas_core.plugins import PluginRegistry, Registration


def _instantiate(registry: PluginRegistry, registration: Registration) -> Backend:
    backend_class = registration.load()
    reason = backend_class.availability()
    if reason is not None:
        raise BackendUnavailableError(
            f"backend {registration.name!r} ({registration.plugin.label}) cannot run here: {reason}"
        )
    backend = backend_class()
    backend.plugin_registry = registry
    return backend


def select_backend(registry: PluginRegistry, name: str | None = None) -> Backend:
    """The named backend, or the first available by descending ``priority`` metadata.

    Unavailable or broken candidates are skipped during automatic selection; the numpy
    backend is always available, so automatic selection always succeeds.
    """
    if name is not None:
        return _instantiate(registry, registry.get("backend", name))
    candidates = sorted(registry.registrations("backend"), key=lambda r: -int(r.metadata.get("priority", 0)))
    reasons = []
    for registration in candidates:
        try:
            return _instantiate(registry, registration)
        except (BackendUnavailableError, PluginError) as exc:
            reasons.append(str(exc))
    raise BackendUnavailableError("no backend can run here: " + "; ".join(reasons))
