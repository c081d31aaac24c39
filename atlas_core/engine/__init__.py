"""The engine: sequences, KV cache, forward batches, sampling and the offline `LLM` API."""
