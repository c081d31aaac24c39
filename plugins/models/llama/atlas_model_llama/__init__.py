"""Atlas model family: Llama 1-3, Mistral (dense), Qwen2, SmolLM and other llama-shaped checkpoints."""
