"""Which implementation of an op group a backend runs: its registered native one, else the host fallback.

Native implementations are registered through the ``register_op_implementations`` hook with the
group's name and ``backend=<backend name>`` metadata. One that cannot be imported, or that does not
subclass the group it claims, is logged and skipped (the host fallback runs instead), so a broken
plugin never stops a model from running; with ``ATLAS_PLUGINS_STRICT=1`` it raises.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from atlas_core.backends.ops import OpGroup
from atlas_core.errors import PluginError
from atlas_core.plugins import PluginRegistry, Registration, strict_mode

log = logging.getLogger("atlas.backends")

G = TypeVar("G", bound=OpGroup)


def native_registrations(
    registry: PluginRegistry, backend_name: str, group_name: str | None = None
) -> list[Registration]:
    """The ``op_impl`` registrations for ``backend_name`` (of ``group_name`` only, when given)."""
    return [
        r
        for r in registry.registrations("op_impl")
        if r.metadata.get("backend") == backend_name and (group_name is None or r.name == group_name)
    ]


def resolve_op_group(registry: PluginRegistry, backend_name: str, group: type[G]) -> type[G]:
    """The class implementing ``group`` on the backend named ``backend_name``: the registered native
    subclass, or ``group`` itself (the host fallback). Two native registrations raise `PluginError`."""
    candidates = native_registrations(registry, backend_name, group.name)
    if len(candidates) > 1:
        owners = " and ".join(r.plugin.label for r in candidates)
        raise PluginError(
            f"op group {group.name!r} has two native implementations for backend {backend_name!r} ({owners}); "
            f"uninstall one, or set ATLAS_PLUGINS to the plugins to load"
        )
    if not candidates:
        return group
    registration = candidates[0]
    try:
        native = registration.load()
        if not (isinstance(native, type) and issubclass(native, group)):
            raise PluginError(
                f"op group implementation {registration.target} from {registration.plugin.label} must subclass "
                f"{group.__module__}.{group.__qualname__}"
            )
    except PluginError as exc:
        if strict_mode():
            raise
        log.warning("%s; the %s ops run through their host fallback", exc, group.name)
        return group
    return native
