"""CUDA-only speed paths for the vision tower: compiled block segments and whole-pass CUDA graphs.

Both are off on the CPU and change no CPU number. On CUDA they are governed by the run options
`fuse` and `graphs` (`-o fuse=off`, `tensordiff.models.deepseek_v41_flash.options`), whose defaults come
from environment variables (read when a `VisionEngine` is built):

    TENSORDIFF_FUSE    0: off; 1: on from the first pass; unset: on from an engine's second pass
    TENSORDIFF_GRAPHS  0: off; 1: the first pass of a grid captures; unset: the second pass
                       captures, later passes replay

"From the second pass" keeps a one-shot `tensordiff check` free of compile and capture time (it
runs the plain eager block), while a served engine, or the benchmark, gets the fast path.

Fusion: `torch.compile` (Inductor, Triton) of the pieces of `vision.VisionBlock` itself, around
attention (which stays the runtime's call, with its kernel order and fallback):
    attn_in: rms_norm -> qkv GEMM + bias -> rope on q and k                 (norm and rope: one kernel each)
    out:     wo GEMM + bias + residual -> rms_norm -> w1 GEMM -> silu*up -> w2 GEMM + residual
They are the block's own methods, so the compiled route is the eager route's code compiled, never a
second copy of it; Inductor keeps fp32 between the fused elementwise steps where eager rounds to
bf16 after each op (silu, then the product), which only removes roundings. Another backend's
kernels (hip) stay eager: their calls are what that backend is tested on; only the glue between
them (`attn_residual`, `ffn_residual`: the GEMMs, residual adds, silu*up) is compiled there.
"""
from __future__ import annotations

# the pieces are generic (Qwen3-VL's tower runs them too): written once, in the runtime
from ..runtime.fused import FusedBlock, GraphCache, can_compile, compile_unavailable, compiled  # noqa: F401
