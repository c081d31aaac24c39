"""Entry point of the ``atlas-gb10`` distribution (group ``atlas``): registers the ``cuda`` backend and its
native implementations of op groups.

Importing this module imports nothing heavy: CuPy is imported only when the backend is selected.
The Gemma family's ``gemma`` group is implemented only where that family's plugin is installed (its
target imports ``atlas_model_gemma``); atlas-gb10 does not depend on it.
"""

from __future__ import annotations

import importlib.util

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_gpu_backends(register: Register) -> None:
    register("cuda", "atlas_gb10.backend:CudaBackend", priority=100)


@hookimpl
def register_op_implementations(register: Register) -> None:
    register("moe", "atlas_gb10.moe:CudaMoEOps", backend="cuda")
    register("gated_delta", "atlas_gb10.gated_delta:CudaGatedDeltaOps", backend="cuda")
    register("mamba2", "atlas_gb10.mamba2:CudaMamba2Ops", backend="cuda")
    register("mla", "atlas_gb10.mla:CudaMLAOps", backend="cuda")
    register("vision", "atlas_gb10.vision:CudaVisionOps", backend="cuda")
    if importlib.util.find_spec("atlas_model_gemma") is not None:
        register("gemma", "atlas_gb10.gemma:CudaGemmaOps", backend="cuda")
