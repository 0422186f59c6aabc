"""Qwen3-VL oracle: transformers' own Qwen3-VL code (pinned), built from a checkpoint and hooked."""
