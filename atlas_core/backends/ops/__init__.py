"""Ops with a host fallback: one module per group of ops that only some model families use.

Each module holds the NumPy reference functions of its ops (host arrays in, host arrays out: the
executable specification) and a mixin class that `Backend` inherits. A mixin method's default runs
on the host through `on_host`: inputs are copied with ``to_numpy``, the reference runs, the result
comes back with ``from_numpy`` (in-place ops write the result back into their argument). That is
correct on every backend and slow off the CPU; a backend overrides an op with its own kernel, and
the conformance suite checks whichever runs. On the NumPy backend the copies are no-ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def on_host(backend: Any, reference: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``reference`` applied to the host copies of ``args``' backend arrays (other arguments pass
    through unchanged); array results (or tuples of them) are copied back to the backend."""

    def down(value: Any) -> Any:
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
