"""Atlas model family: DeepSeek-V3 and Mistral Small 4 (multi-head latent attention + Mixture-of-Experts)."""
