"""Checkpoint readers: safetensors folders and GGUF files behind one `WeightSource` protocol."""
