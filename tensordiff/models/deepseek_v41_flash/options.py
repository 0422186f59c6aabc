"""DeepSeek V4.1 Flash: the run options (`-o NAME=VALUE`), one typed table.

Both runners read their options through `OPTIONS.resolve(req.options)`, so a default is
written here once and a hand-built RunRequest gets the same values as the CLI. No torch here.
"""
from __future__ import annotations

from tensordiff.pipeline.options import Option, OptionTable

# the CUDA attention kernels the engine can be told to try (engine.runtime.attention.KERNELS, and
# its own Triton kernel, OWN_KERNELS: only when asked for)
ATTENTION_KERNELS = ("cudnn", "flash", "efficient", "math", "triton")

OPTIONS = OptionTable((
    Option("attention", "list", None, "CUDA SDPA kernels the engine's vision tower tries, in order, comma-separated "
           "(default: cudnn,flash,efficient,math; triton: our own kernel, only when asked; the CPU has one kernel)",
           choices=ATTENTION_KERNELS, side="engine"),
    Option("language_numerics", "choice", "official", "the language backbone's numerics, both sides: official "
           "(what the official code computes: bf16 with the kernels' FP8/FP4 rounding, whatever --dtype the vision "
           "half runs in) or semantic (the run's --dtype, exact dequantised weights, no rounding)",
           choices=("official", "semantic"), side="both"),
    Option("kernel_quant", "bool", None, "the language kernels' FP8 window-KV / FP4 indexer activation round "
           "trips, both sides; unset: follows language_numerics (on when official), true/false overrides it",
           side="both"),
    Option("index_keys", "choice", "official", "the index keys a decode step's indexers read: official (the "
           "official code's one shared reference, re-pointed by an owner only on a step that completes a group, "
           "so a layer may read a later layer's keys) or own (the prefill rule's keys at every step)",
           choices=("official", "own"), side="both"),
    Option("fuse", "switch", "auto", "compiled vision block segments, CUDA only: off, on (from the first pass), "
           "auto (from an engine's second pass)", side="engine", env="TENSORDIFF_FUSE"),
    Option("graphs", "switch", "auto", "whole-pass CUDA graphs per grid, CUDA only: off, on (capture at the first "
           "pass), auto (at the second)", side="engine", env="TENSORDIFF_GRAPHS"),
))
