"""Atlas model family: Qwen3-MoE (Qwen3 attention with sparse Mixture-of-Experts feed-forward layers)."""
