"""A Triton flash-attention forward (bidirectional, no mask): the attention kernel `triton`.

    flash_attention(q, k, v, scale=None) -> o      q, k, v: [B, H, N, hd] (hd 16..128, a power of 2)

Asked for by name in the runtime's kernel order (`attention(..., prefer=["triton", "cudnn", ...])`,
`-o attention=triton,cudnn` for DeepSeek), never by default: `bench/engine_speed.py` times it
beside cuDNN, flash and efficient SDPA at the DeepSeek tower's shape (16 heads x 8,910 tokens x
64) and puts it first only where it measures fastest and agrees with flash. One program per (query block,
batch x head); the key/value blocks stream through an online softmax (running max and sum in
fp32, exp2 with the scale folded into log2 e), the output rescaled as the max grows; the
last block's columns past N are masked to -inf. A few tile shapes are tried by Triton's
bench on the first call per shape.

`TRITON_INTERPRET=1` runs it on the CPU (slowly): tests/engine/runtime/test_runtime_triton_attention.py
holds it to SDPA there when Triton is installed. Importing this module needs Triton; the runtime
imports it only when the kernel is asked for (`unavailable` says why it cannot run).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried on the GPU, the fastest kept per shape
CONFIGS = ((128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 64, 8, 4), (128, 32, 4, 4))
_chosen: dict = {}


@triton.jit
def _forward(Q, K, V, O, sm_scale_log2, N,
             stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
             H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    for start_n in range(0, N, BLOCK_N):
        cols = start_n + offs_n
        # k as [BLOCK_N, hd] rows (contiguous loads), transposed in registers for the product
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale_log2  # [BLOCK_M, BLOCK_N], log2 units
        s = tl.where(cols[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < N, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=offs_m[:, None] < N)


def unavailable(q: torch.Tensor) -> str | None:
    """Why this kernel cannot take the call [B, H, N, hd] q, or None."""
    if q.shape[-1] not in (16, 32, 64, 128):
        return f"triton declined the call (head size {q.shape[-1]}: 16, 32, 64 or 128)"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"triton declined the call (dtype {q.dtype}: bfloat16 or float16)"
    return None


def _launch(q, k, v, o, scale, config):
    b, h, n, hd = q.shape
    bm, bn, warps, stages = config
    _forward[(triton.cdiv(n, bm), b * h)](q, k, v, o, scale * math.log2(math.e), n,
                                         *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                                         H=h, HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                                         num_stages=stages)


def _fastest(q, k, v, o, scale):
    """Each config timed on this call's operands (CUDA events, after one untimed call)."""
    best, best_ms = None, float("inf")
    for config in CONFIGS:
        try:
            _launch(q, k, v, o, scale, config)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(5):
                _launch(q, k, v, o, scale, config)
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b) / 5
        except Exception:  # noqa: BLE001 - a config over this GPU's shared memory: not a candidate
            continue
        if ms < best_ms:
            best, best_ms = config, ms
    if best is None:
        raise RuntimeError("no Triton attention config runs on this device")
    return best


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                    config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """config: (BLOCK_M, BLOCK_N, num_warps, num_stages); default: the fastest of CONFIGS for this
    shape on CUDA (chosen once), (64, 64, 4, 2) elsewhere (the interpreter)."""
    b, h, n, hd = q.shape
    if hd not in (16, 32, 64, 128) or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"flash_attention takes equal [B, H, N, hd] operands with hd in 16..128 (a power of 2), "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    # [B, N, H, hd] memory behind the [B, H, N, hd] view, as SDPA's fused kernels lay it out: the
    # caller's [N, H * hd] reshape after attention is then free
    o = torch.empty(b, n, h, hd, dtype=q.dtype, device=q.device).transpose(1, 2)
    scale = hd ** -0.5 if scale is None else scale
    if config is None:
        key = (q.device, q.dtype, b, h, n, hd)
        if key not in _chosen:
            _chosen[key] = _fastest(q, k, v, o, scale) if q.is_cuda else (64, 64, 4, 2)
        config = _chosen[key]
    _launch(q, k, v, o, scale, config)
    return o
