"""Qwen3-VL: the run options (`-o NAME=VALUE`), one typed table.

Both runners read their options through `OPTIONS.resolve(req.options)`. `attention` is the
oracle's transformers attention implementation (spelled `attn` before; still accepted). No torch.

`processor` defaults to `pil` whatever is installed: transformers 5.17 picks its torchvision image
processor (`Qwen2VLImageProcessor`) where torchvision imports and its PIL one
(`Qwen2VLImageProcessorPil`) elsewhere, and the two differ by a few pixel levels, so a default that
followed the environment would make one command mean two runs (and one oracle cache key two
dumps). The install brings Pillow, which `pil` needs; torchvision is an opt-in, because a
torchvision wheel is built for one torch release.
"""
from __future__ import annotations

from tensordiff.pipeline.options import Option, OptionTable

PROCESSORS = ("pil", "torchvision")
ORACLE_ATTENTION = ("sdpa", "eager")

OPTIONS = OptionTable((
    Option("processor", "choice", "pil", "image processor for both sides (also --processor): pil, transformers' "
           "PIL/NumPy processor, needs only Pillow; torchvision, its torchvision processor (transformers' own pick "
           "where torchvision is installed), needs a torchvision built for your torch", choices=PROCESSORS,
           side="both"),
    Option("attention", "choice", "sdpa", "the transformers oracle's attention implementation",
           choices=ORACLE_ATTENTION, side="oracle", aliases=("attn",)),
    Option("fuse", "switch", "auto", "compiled vision blocks, CUDA only: off, on (from the first pass), auto (from "
           "a tower's second pass)", side="engine", env="TENSORDIFF_FUSE"),
    Option("graphs", "switch", "auto", "whole-pass CUDA graphs per grid (untapped passes), CUDA only: off, on "
           "(capture at the first pass), auto (at the second)", side="engine", env="TENSORDIFF_GRAPHS"),
))
