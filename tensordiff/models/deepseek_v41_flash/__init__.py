"""DeepSeek V4.1 Flash in the toolkit: adapter, language contract, faults, options, synthetic weights."""
from tensordiff.models.deepseek_v41_flash.adapter import ADAPTER

__all__ = ["ADAPTER"]
