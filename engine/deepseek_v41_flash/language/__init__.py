"""DeepSeek V4.1 Flash language backbone in the engine: dual-bias MoE, Engram state machine,
latent sparse attention with KV cache, chunked prefill across the image span, greedy decode."""
