"""Qwen3-VL: the run options (`-o NAME=VALUE`), one typed table.

Both runners read their options through `OPTIONS.resolve(req.options)`. `attention` is the
oracle's transformers attention implementation (spelled `attn` before; still accepted). No torch.
"""
from __future__ import annotations

from tensordiff.pipeline.options import Option, OptionTable

PROCESSORS = ("pil", "torchvision")
ORACLE_ATTENTION = ("sdpa", "eager")

OPTIONS = OptionTable((
    Option("processor", "choice", None, "image processor for both sides (default: torchvision when importable, "
           "else pil; also --processor)", choices=PROCESSORS, side="both"),
    Option("attention", "choice", "sdpa", "the transformers oracle's attention implementation",
           choices=ORACLE_ATTENTION, side="oracle", aliases=("attn",)),
    Option("fuse", "switch", "auto", "compiled vision blocks, CUDA only: off, on (from the first pass), auto (from "
           "a tower's second pass)", side="engine", env="TENSORDIFF_FUSE"),
    Option("graphs", "switch", "auto", "whole-pass CUDA graphs per grid (untapped passes), CUDA only: off, on "
           "(capture at the first pass), auto (at the second)", side="engine", env="TENSORDIFF_GRAPHS"),
))
