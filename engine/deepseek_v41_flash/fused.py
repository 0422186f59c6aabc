"""CUDA-only speed paths for the vision tower: compiled block segments and whole-pass CUDA graphs.

Both are off on the CPU and change no CPU number. On CUDA they are governed by the run options
`fuse` and `graphs` (`-o fuse=off`, `tensordiff.models.deepseek_options`), whose defaults come
from environment variables (read when a `VisionEngine` is built):

    TENSORDIFF_FUSE    0: off; 1: on from the first pass; unset: on from an engine's second pass
    TENSORDIFF_GRAPHS  0: off; 1: the first pass of a grid captures; unset: the second pass
                       captures, later passes replay

"From the second pass" keeps a one-shot `tensordiff check` free of compile and capture time (it
runs the plain eager block), while a served engine, or the benchmark, gets the fast path.

Fusion: `torch.compile` (Inductor, Triton) of the block's two segments around attention:
    pre:  rms_norm -> qkv GEMM + bias -> rope on q and k                   (norm and rope: one kernel each)
    post: wo GEMM + bias + residual -> rms_norm -> w1 GEMM -> silu*up -> w2 GEMM + residual
The segments call the torch backend's own ops, so they are that backend's semantics compiled;
Inductor keeps fp32 between the fused elementwise steps where eager rounds to bf16 after each op
(silu, then the product), which only removes roundings. Another backend's kernels (hip) stay
eager: their calls are what that backend is tested on; only the glue between them (the
residual adds, silu*up) is compiled there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .vision import NORM_EPS


def can_compile(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401  (Inductor's GPU code generator)
    except ImportError:
        return False
    return True


def _compile(fn):
    return torch.compile(fn, dynamic=False, fullgraph=True)


class FusedBlock:
    """`VisionTower.block`'s numbers through compiled segments; attention stays the runtime's call."""

    def __init__(self, tower, heads_major: bool = False):
        """heads_major: the pre segment writes q, k, v as contiguous [H, N, hd] (the layout SDPA
        kernels index natively) instead of views of the [N, 3, H, hd] GEMM output."""
        self.tower = tower
        be = tower.backend
        nh, hd = tower.cfg.vision_n_heads, tower.cfg.vision_head_dim
        self.full = getattr(be, "name", "") == "torch"

        if self.full:
            def pre(x, norm1, wqkv, bqkv, cos, sin):
                n = x.shape[0]
                h = be.rms_norm(x, norm1, NORM_EPS)
                qkv = be.linear(h, wqkv, bqkv).view(n, 3, nh, hd)
                qk = be.rope_rotate_half(qkv[:, :2].reshape(n, 2 * nh, hd), cos, sin)
                q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, 2]
                if heads_major:  # [N, H, hd] views of [H, N, hd] buffers
                    return tuple(t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
                return q, k, v

            def post(x, o, wo, bo, norm2, w1, w2):
                n = x.shape[0]
                x = x + be.linear(o.reshape(n, nh * hd), wo, bo)
                h = be.rms_norm(x, norm2, NORM_EPS)
                gate, up = be.linear(h, w1, None).chunk(2, dim=-1)
                return x + be.linear(F.silu(gate) * up, w2, None)

            self.pre, self.post = _compile(pre), _compile(post)
        else:
            def residual(x, o, wo, bo):
                return x + F.linear(o.reshape(x.shape[0], nh * hd), wo, bo)

            def mlp(x, h, w1, w2):
                gate, up = F.linear(h, w1, None).chunk(2, dim=-1)
                return x + F.linear(F.silu(gate) * up, w2, None)

            self.residual, self.mlp = _compile(residual), _compile(mlp)

    error: str | None = None  # why compiling failed (then every call runs the eager block)
    _ok = False

    def __call__(self, x, blk, cos, sin):
        if self._ok:
            return self._run(x, blk, cos, sin)
        if self.error is not None:
            return self.tower.block(x, blk, cos, sin)
        try:  # the first call compiles: a toolchain failure must not take the engine down
            y = self._run(x, blk, cos, sin)
        except Exception as e:
            self.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            return self.tower.block(x, blk, cos, sin)
        self._ok = True
        return y

    def _run(self, x, blk, cos, sin):
        t = self.tower
        nh = t.cfg.vision_n_heads
        if self.full:
            q, k, v = self.pre(x, blk.norm1, blk.wqkv, blk.bqkv, cos, sin)
            o = t.attend(q, k, v)
            return self.post(x, o, blk.wo, blk.bo, blk.norm2, blk.w1, blk.w2)
        be, n, hd = t.backend, x.shape[0], t.cfg.vision_head_dim
        h = be.rms_norm(x, blk.norm1, NORM_EPS)
        qkv = be.linear(h, blk.wqkv, blk.bqkv).view(n, 3, nh, hd)
        qk = be.rope_rotate_half(qkv[:, :2].reshape(n, 2 * nh, hd), cos, sin)
        o = t.attend(qk[:, :nh], qk[:, nh:], qkv[:, 2])
        x = self.residual(x, o, blk.wo, blk.bo)
        return self.mlp(x, be.rms_norm(x, blk.norm2, NORM_EPS), blk.w1, blk.w2)


class GraphCache:
    """Whole-pass CUDA graphs keyed by the input's shape (one per patch grid), at most `size`.

    fn(static_in) -> out is captured once its key has been seen `after` times; a replay copies
    the new input into the captured buffer and returns a clone of the captured output (the next
    replay overwrites it). A capture that fails marks the key eager for this process.
    """

    def __init__(self, fn, after: int = 1, size: int = 4):
        self.fn, self.after, self.size = fn, after, size
        self.seen: dict = {}
        self.graphs: dict = {}
        self.failed: set = set()
        self.error: str | None = None

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        g = self.graphs.get(key)
        if g is not None:
            graph, static_in, static_out = g
            static_in.copy_(x)
            graph.replay()
            return static_out.clone()
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
        graph.replay()
        return static_out.clone()
