"""Atlas for Python: a plugin-based LLM inference engine.

The offline API mirrors vLLM's names::

    from atlas_core import LLM, SamplingParams
    llm = LLM()                                   # the built-in default model
    print(llm.chat([{"role": "user", "content": "Hi"}])[0].outputs[0].text)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atlas_core.version import __version__

if TYPE_CHECKING:
    from atlas_core.engine.llm import LLM
    from atlas_core.engine.outputs import CompletionOutput, RequestOutput
    from atlas_core.engine.sampling_params import SamplingParams

_LAZY = {
    "LLM": "atlas_core.engine.llm",
    "SamplingParams": "atlas_core.engine.sampling_params",
    "RequestOutput": "atlas_core.engine.outputs",
    "CompletionOutput": "atlas_core.engine.outputs",
}

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str) -> Any:
    """Import the public API lazily so ``atlas plugins`` stays fast and light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'atlas_core' has no attribute {name!r}")
