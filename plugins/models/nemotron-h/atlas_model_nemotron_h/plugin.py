"""Entry point of the ``atlas-model-nemotron-h`` distribution (group ``atlas``)."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_model_loaders(register: Register) -> None:
    # Nemotron-H / Nemotron Nano 2 chat models think inside <think> ... </think> (qwen3-style markers) and
    # call tools as <TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL> (the "nemotron" parser).
    # Nemotron 3 models share the model_type but use Qwen3-Coder's XML tool calls ("qwen3_coder").
    register(
        "nemotron_h",
        "atlas_model_nemotron_h.loader:NemotronHLoader",
        architectures=["NemotronHForCausalLM"],
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "nemotron"},
    )
