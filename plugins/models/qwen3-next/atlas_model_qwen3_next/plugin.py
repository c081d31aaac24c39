"""Entry point of the ``atlas-model-qwen3-next`` distribution (group ``atlas``).

Qwen3.5 checkpoints are published as vision-language models (``qwen3_5`` / ``qwen3_5_moe``, text stack
under ``model.language_model.*``); text-only saves use ``qwen3_5_text`` / ``qwen3_5_moe_text``. Qwen3.5
writes tool calls in the XML function/parameter format (``qwen3_coder``); Qwen3-Next in Hermes JSON.
"""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl

LOADER = "atlas_model_qwen3_next.loader:Qwen3NextLoader"
QWEN3_5_DEFAULTS = {"reasoning_parser": "qwen3", "tool_call_parser": "qwen3_coder"}


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "qwen3_next",
        LOADER,
        architectures=["Qwen3NextForCausalLM"],
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "hermes"},
    )
    register("qwen3_5", LOADER, architectures=["Qwen3_5ForConditionalGeneration"], defaults=QWEN3_5_DEFAULTS)
    register("qwen3_5_text", LOADER, architectures=["Qwen3_5ForCausalLM"], defaults=QWEN3_5_DEFAULTS)
    register("qwen3_5_moe", LOADER, architectures=["Qwen3_5MoeForConditionalGeneration"], defaults=QWEN3_5_DEFAULTS)
    register("qwen3_5_moe_text", LOADER, architectures=["Qwen3_5MoeForCausalLM"], defaults=QWEN3_5_DEFAULTS)
