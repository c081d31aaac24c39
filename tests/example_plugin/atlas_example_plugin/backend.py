"""``example-numpy``: the NumPy reference backend, counting every op call per instance."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from atlas_core.backends.numpy_backend import NumpyBackend

COUNTED_OPS = (
    "embedding",
    "linear",
    "rms_norm",
    "silu_mul",
    "rope",
    "write_kv",
    "attention",
    "log_softmax",
    "argmax",
    "adjust_logits",
    "sample",
)
"""The compute ops of the backend contract (memory ops ``from_numpy``/``to_numpy``/``zeros`` are not counted)."""


class CountingNumpyBackend(NumpyBackend):
    """Exactly `NumpyBackend`'s results; ``op_calls[op]`` counts the calls of each op in `COUNTED_OPS`."""

    name = "example-numpy"

    def __init__(self) -> None:
        super().__init__()
        self.op_calls: Counter[str] = Counter()


def _counted(op: str) -> Callable[..., Any]:
    reference = getattr(NumpyBackend, op)

    def counted_op(self: CountingNumpyBackend, *args: Any, **kwargs: Any) -> Any:
        self.op_calls[op] += 1
        return reference(self, *args, **kwargs)

    counted_op.__name__ = counted_op.__qualname__ = op
    counted_op.__doc__ = reference.__doc__
    return counted_op


for _op in COUNTED_OPS:
    setattr(CountingNumpyBackend, _op, _counted(_op))


class EagerDecodeGraphs:
    """Decode "graphs" that run the forward eagerly (`atlas_core.engine.decode_graphs.DecodeGraphs`): the hook a
    backend with captured graphs implements, in its simplest form. ``replays`` counts the steps served."""

    def __init__(self, model: Any, kv: Any) -> None:
        self.model, self.kv = model, kv
        self.replays = 0
        self.last_hidden: Any = None

    def can_run(self, batch: Any) -> bool:
        return bool(batch.is_pure_decode)

    def run(self, batch: Any) -> Any:
        self.replays += 1
        self.last_hidden = self.model.forward(batch, self.kv)
        return self.model.compute_logits(self.last_hidden)

    def captures(self, batch: Any) -> bool:
        return False  # nothing to capture: every step runs as it comes

    def close(self) -> None:
        self.last_hidden = None


class GraphsNumpyBackend(CountingNumpyBackend):
    """``example-graphs``: `CountingNumpyBackend` whose pure decode steps go through `EagerDecodeGraphs`."""

    name = "example-graphs"

    def decode_graphs(self, model: Any, kv: Any) -> EagerDecodeGraphs:
        return EagerDecodeGraphs(model, kv)
