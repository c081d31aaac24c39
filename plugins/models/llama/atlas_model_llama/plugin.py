"""Entry point of the ``atlas-model-llama`` distribution (group ``atlas``)."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_model_loaders(register: Register) -> None:
    register("llama", "atlas_model_llama.loader:LlamaLoader", architectures=["LlamaForCausalLM"])
    register("mistral", "atlas_model_llama.loader:MistralLoader", architectures=["MistralForCausalLM"])
    register("qwen2", "atlas_model_llama.loader:Qwen2Loader", architectures=["Qwen2ForCausalLM"])
