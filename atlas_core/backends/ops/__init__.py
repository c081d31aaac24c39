"""Op groups: sets of ops beyond the core `Backend` contract that only some layers use.

An op group is a subclass of `OpGroup` with a ``name``: its methods are the group's typed interface
and their bodies are the host fallback, the group's NumPy reference functions run through `on_host`
(inputs copied with ``to_numpy``, the reference run, the result copied back with ``from_numpy``;
in-place ops write back through `host_state`). That is correct on every backend and slow off the
CPU. A backend runs a group natively through a subclass of the group that overrides its methods,
registered for that backend's name (``register_op_implementations``); layers ask their backend for
a group with ``backend.ops(MoEOps)`` and never know which implementation answers. A plugin adds a
new group by defining an `OpGroup` subclass and registering it (``register_op_groups``), without
touching core. The conformance suite checks whichever implementation a backend resolves.

Core's groups, one module each: ``moe``, ``mla``, ``gated_delta``, ``mamba2``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from atlas_core.weights.quantized import QuantizedWeight

if TYPE_CHECKING:
    from atlas_core.backends.base import Backend


class OpGroup:
    """Base of every op group (see the module docstring). Instances are bound to one backend
    (``self.backend``) and made by `atlas_core.backends.base.Backend.ops`, once per backend and group.

    Subclasses set ``name`` (the registered group name). A native implementation subclasses the
    group it implements, keeps ``name``, and may override any subset of its methods; the rest keep
    their host fallback. Its constructor takes only the backend.
    """

    name: ClassVar[str] = ""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend


def on_host(backend: Any, reference: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``reference`` applied to the host copies of ``args``' backend arrays (other arguments pass
    through unchanged; a `QuantizedWeight` arrives with host arrays); array results (or tuples of them)
    are copied back to the backend."""

    def down(value: Any) -> Any:
        if isinstance(value, QuantizedWeight):
            return value.map_arrays(down)
        return value if isinstance(value, (int, float, bool, str, type(None), np.ndarray)) else backend.to_numpy(value)

    host_args = [down(a) for a in args]
    host_kwargs = {k: down(v) for k, v in kwargs.items()}
    result = reference(*host_args, **host_kwargs)
    if isinstance(result, tuple):
        return tuple(backend.from_numpy(r) if isinstance(r, np.ndarray) else r for r in result)
    return backend.from_numpy(result) if isinstance(result, np.ndarray) else result


@contextmanager
def host_state(backend: Any, *arrays: Any) -> Iterator[list[np.ndarray]]:
    """Writable host copies of backend ``arrays`` that a reference updates in place (caches,
    recurrent state); on exit each copy is written back into its array. On the NumPy backend the
    "copies" are the arrays themselves and nothing is copied."""
    hosts = [backend.to_numpy(a) for a in arrays]
    hosts = [h if h.flags.writeable else h.copy() for h in hosts]
    yield hosts
    for array, host in zip(arrays, hosts, strict=True):
        if host is not array:
            array[...] = backend.from_numpy(host, dtype=host.dtype)
