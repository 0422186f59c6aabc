"""Compiled block pieces and whole-pass CUDA graphs, for any tower written as a block protocol.

A block (DeepSeek's `vision.VisionBlock`, Qwen3-VL's `vision.QwenBlock`) is called as
`block(x, blk, cos, sin)` with its weights `blk` as an argument (so one compiled graph serves
every layer), and is written as pieces:

    attn_in(x, blk, cos, sin) -> q, k, v      norm -> qkv GEMM -> rope
    attend(q, k, v)                           the runtime's attention call: never compiled
    out(x, o, blk)                            attn_residual -> norm -> ffn_residual

`FusedBlock` compiles those same pieces (never a second copy of the code); on the torch backend
`attn_in` and `out` whole, on another backend (hip) only the glue `attn_residual` and
`ffn_residual`, so that backend's kernels stay what it is tested on. `GraphCache` captures a whole
pass per input shape. Both are CUDA speed paths; the models' engines decide when they run.
"""
from __future__ import annotations

import copy

import torch


def compile_unavailable(device: torch.device) -> str | None:
    """Why the block cannot be compiled on `device`, or None."""
    if device.type != "cuda":
        return f"compiled blocks are CUDA only (device {device.type})"
    try:
        import triton  # noqa: F401  (Inductor's GPU code generator)
    except ImportError:
        return "Triton is not installed (Inductor's GPU code generator)"
    return None


def can_compile(device: torch.device) -> bool:
    return compile_unavailable(device) is None


def _compile(fn):
    return torch.compile(fn, dynamic=False, fullgraph=True)


def _heads_major(attn_in):
    """attn_in writing q, k, v as contiguous [H, N, hd] (the layout SDPA kernels index natively)
    behind [N, H, hd] views, instead of views of the [N, 3, H, hd] GEMM output."""
    def pieces(*args):
        return tuple(t.transpose(0, 1).contiguous().transpose(0, 1) for t in attn_in(*args))

    return pieces


def compiled(block, heads_major: bool = False):
    """A copy of `block` (a `vision.VisionBlock`) whose pieces are those same pieces compiled."""
    c = copy.copy(block)
    if getattr(block.backend, "name", "") == "torch":
        c.attn_in = _compile(_heads_major(block.attn_in) if heads_major else block.attn_in)
        c.out = _compile(block.out)
    else:  # c.out, the block's own method on the copy, runs the compiled glue around eager norms
        c.attn_residual = _compile(block.attn_residual)
        c.ffn_residual = _compile(block.ffn_residual)
    return c


class FusedBlock:
    """The block through its compiled pieces; if compiling fails, the eager block from then on,
    with the reason in `error` (the engine writes it to the manifest's speed path)."""

    def __init__(self, block, heads_major: bool = False):
        self.eager = block
        self.full = getattr(block.backend, "name", "") == "torch"  # the whole block compiled
        self.compiled = compiled(block, heads_major)
        self.error: str | None = None
        self.ok = False  # compiled and ran

    def __call__(self, x, blk, cos, sin):
        if self.ok:
            return self.compiled(x, blk, cos, sin)
        if self.error is not None:
            return self.eager(x, blk, cos, sin)
        try:  # the first call compiles: a toolchain failure must not take the engine down
            y = self.compiled(x, blk, cos, sin)
        except Exception as e:
            text = str(e).strip()
            self.error = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
            return self.eager(x, blk, cos, sin)
        self.ok = True
        return y


class GraphCache:
    """Whole-pass CUDA graphs keyed by the input's shape (one per patch grid), at most `size`.

    fn(static_in) -> out (a tensor, or a tuple of tensors) is captured once its key has been seen
    `after` times; a replay copies the new input into the captured buffer and returns a clone of
    the captured output (the next replay overwrites it). A capture that fails marks the key eager for this process.
    """

    def __init__(self, fn, after: int = 1, size: int = 4):
        self.fn, self.after, self.size = fn, after, size
        self.seen: dict = {}
        self.graphs: dict = {}
        self.failed: set = set()
        self.error: str | None = None
        self.captures = self.replays = 0  # what the speed path reports

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        g = self.graphs.get(key)
        if g is not None:
            graph, static_in, static_out = g
            static_in.copy_(x)
            graph.replay()
            self.replays += 1
            return _clone(static_out)
        self.seen[key] = self.seen.get(key, 0) + 1
        if key in self.failed or self.seen[key] <= self.after or len(self.graphs) >= self.size:
            return self.fn(x)
        return self._capture(key, x)

    def _capture(self, key, x):
        static_in = x.clone()
        try:
            # warm on a side stream (cuBLAS workspaces, cuDNN plans, compiled kernels), then capture
            s = torch.cuda.Stream(device=x.device)
            s.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(s):
                self.fn(static_in)
            torch.cuda.current_stream(x.device).wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.fn(static_in)
        except Exception as e:  # a kernel that cannot be captured: this key runs eagerly from now on
            self.failed.add(key)
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            torch.cuda.synchronize(x.device)
            return self.fn(x)
        self.graphs[key] = (graph, static_in, static_out)
        self.captures += 1
        graph.replay()
        return _clone(static_out)


def _clone(out):
    return tuple(t.clone() for t in out) if isinstance(out, (tuple, list)) else out.clone()
