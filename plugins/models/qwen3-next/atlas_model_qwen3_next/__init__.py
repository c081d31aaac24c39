"""Atlas model family: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, hybrids of gated delta net and gated attention layers."""
