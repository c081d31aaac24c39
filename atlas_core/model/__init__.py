"""Model definition: config specs, RoPE tables, layers, the generic transformer, loading."""
