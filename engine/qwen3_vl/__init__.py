"""Qwen3-VL in the engine: the vision tower, the image-token positions and the text decoder, our own implementation."""
