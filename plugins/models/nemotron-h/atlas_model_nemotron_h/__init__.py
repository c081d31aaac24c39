"""Atlas model family: Nemotron-H hybrids (Mamba-2, attention without RoPE, squared-ReLU MLP and MoE layers)."""
