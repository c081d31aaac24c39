"""Atlas model family: Gemma 3 and Gemma 4 (dense and Mixture-of-Experts)."""
