"""Atlas model family: Qwen3 dense models."""
