"""Core layer primitives (registered as TransformerLayer types by core's built-in plugin)."""
