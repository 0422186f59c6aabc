"""DeepSeek V4.1 Flash, the official semantics (vision path: preprocessing, ViT, aligner)."""
