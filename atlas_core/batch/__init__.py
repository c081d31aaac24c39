"""What one model forward reads and writes: the flattened `ForwardBatch` and the paged KV cache
(per-layer layouts, sizing, storage). The engine builds them, model layers consume them; this
package depends on neither."""
