"""A third-party Atlas plugin, written only against Atlas's public API.

This module is the entry point named in ``pyproject.toml`` (group ``atlas``). Atlas imports it
when it builds its plugin registry, so it stays light: it imports nothing but the hook marker,
and every target below is a ``"module:Attribute"`` string that Atlas imports only when the
name is selected.

What it registers:
  * backend ``example-numpy``: core's NumPy backend that counts every op it runs;
    priority -10, so automatic selection never prefers it over ``numpy``.
  * backend ``example-graphs``: the same, serving pure decode steps through decode "graphs" of its
    own that run eagerly (the hook a backend with captured graphs implements); priority -20.
  * model family ``example_llama``: llama-shaped checkpoints whose ``config.json`` says
    ``"model_type": "example_llama"``, built by core's dense-decoder loader.
  * layer type ``example_rms_norm``: core's RMSNorm that counts its calls (used by the family).
  * comm backend ``example-recording``: one rank, recording every collective it is asked for.
  * tool-call parser ``example_calls`` and reasoning parser ``example_thoughts``: the markup of
    a model that writes ``<|call|>name{json}<|end|>`` and thinks in ``<|thinking|>`` blocks.
"""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_gpu_backends(register: Register) -> None:
    register("example-numpy", "atlas_example_plugin.backend:CountingNumpyBackend", priority=-10)
    register("example-graphs", "atlas_example_plugin.backend:GraphsNumpyBackend", priority=-20)


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "example_llama", "atlas_example_plugin.loader:ExampleLlamaLoader", architectures=["ExampleLlamaForCausalLM"]
    )


@hookimpl
def register_layers(register: Register) -> None:
    register("example_rms_norm", "atlas_example_plugin.layers:CountingRMSNorm")


@hookimpl
def register_comm_backends(register: Register) -> None:
    register("example-recording", "atlas_example_plugin.comm:RecordingComm")


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("example_calls", "atlas_example_plugin.parsers:ExampleCallFormat")


@hookimpl
def register_reasoning_parsers(register: Register) -> None:
    register("example_thoughts", "atlas_example_plugin.parsers:EXAMPLE_THOUGHTS")
