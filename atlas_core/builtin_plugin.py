"""Core's own registrations, made through the same hooks as any third-party plugin."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_gpu_backends(register: Register) -> None:
    register("numpy", "atlas_core.backends.numpy_backend:NumpyBackend", priority=0)


@hookimpl
def register_layers(register: Register) -> None:
    register("attention", "atlas_core.model.layers.attention:Attention")
    register("swiglu_mlp", "atlas_core.model.layers.mlp:SwiGLUMLP")
    register("rms_norm", "atlas_core.model.layers.norm:RMSNorm")


@hookimpl
def register_comm_backends(register: Register) -> None:
    register("single", "atlas_core.comm:SingleProcessComm")
