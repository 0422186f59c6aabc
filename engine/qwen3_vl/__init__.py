"""Qwen3-VL in the engine: the vision tower and the image-token positions, our own implementation."""
