"""spec-zoo-bench: benchmark methods against plain decoding and transformers references."""
