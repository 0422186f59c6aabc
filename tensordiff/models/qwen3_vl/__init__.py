"""Qwen3-VL in the toolkit: adapter, faults, options, synthetic weights."""
from tensordiff.models.qwen3_vl.adapter import ADAPTER

__all__ = ["ADAPTER"]
