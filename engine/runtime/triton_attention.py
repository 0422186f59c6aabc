"""Triton flash-attention forwards (bidirectional, no mask): the attention kernel `triton`.

    flash_attention(q, k, v, scale=None) -> o      q, k, v: [B, H, N, hd] (hd 16..128, a multiple of 8)

Asked for by name in the runtime's kernel order (`attention(..., prefer=["triton", "cudnn", ...])`,
`-o attention=triton,cudnn` for DeepSeek), never by default: `bench/engine_speed.py` times it
beside cuDNN, flash and efficient SDPA at the DeepSeek tower's shape (16 heads x 8,910 tokens x
64) and puts it first only where it measures fastest and agrees with flash; `bench/attention_sweep.py`
tries a grid of configs of both kernels in one process. One program per (query block,
batch x head); the key/value blocks stream through an online softmax (running max and sum in
fp32, exp2 with the scale folded into log2 e), the output rescaled as the max grows.

Two kernels, one config tuple `(BLOCK_M, BLOCK_N, num_warps, num_stages[, variant])`:
- "v1" (`_forward`): every key block masked (the last one's columns past N to -inf); head dims
  a power of 2 only.
- "tuned" (`_forward_tuned`, the Hopper-minded one): the full key blocks run unmasked and only
  the last partial one is masked (one masked step instead of a where per block); the scale is
  folded into one multiply-add per score (s * scale - max, in log2 units); K/V loads pipelined by
  the compiler over `num_stages`; a head dim that is not a power of 2 (Qwen3-VL's 72) runs as a
  power-of-2 main part plus a tail padded to 16 (64 + 16: 11% more MMA work, where padding 72 to
  128 would be 78%), masked loads, zero columns that change no sum. That tail faulted on an H200
  (illegal memory access, Triton 3.6) while it stays in bounds under the interpreter (a NaN guard
  region around the operands stays unread): `unavailable` declines such head dims and the default
  config is chosen only at a power of 2; only a named config runs the tail (the sweep, isolated).
- "tuned_ws": "tuned" with `tl.range(..., warp_specialize=True)` for the key loop, where the
  installed Triton has it (`WARP_SPECIALIZE`; Hopper / Blackwell producer-consumer warps).
- "tuned_tma" / "tuned_tma_ws": K and V through in-kernel tensor descriptors (TMA loads on
  Hopper; the descriptor's bounds zero the rows past N and the head dim's tail), where Triton has
  them (`TENSOR_DESCRIPTORS`); only in the sweep's grid, not among the first-call CONFIGS (their
  bases and strides must be 16-byte aligned, checked before launch).

`TRITON_INTERPRET=1` runs them on the CPU (slowly): tests/engine/runtime/test_runtime_triton_attention.py
holds them to SDPA there when Triton is installed. Importing this module needs Triton; the runtime
imports it only when the kernel is asked for (`unavailable` says why it cannot run).
"""
from __future__ import annotations

import inspect
import math

import torch
import triton
import triton.language as tl

# whether this Triton's tl.range takes warp_specialize (3.4 and later, Hopper and Blackwell)
WARP_SPECIALIZE = "warp_specialize" in inspect.signature(tl.range).parameters
# whether this Triton builds tensor descriptors in a kernel (TMA loads on Hopper; 3.4 and later)
TENSOR_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")
VARIANTS = (("v1", "tuned") + (("tuned_ws",) if WARP_SPECIALIZE else ())
            + (("tuned_tma",) if TENSOR_DESCRIPTORS else ())
            + (("tuned_tma_ws",) if TENSOR_DESCRIPTORS and WARP_SPECIALIZE else ()))

# (BLOCK_M, BLOCK_N, num_warps, num_stages, variant) tried on the GPU at a shape's first call, the
# fastest kept per shape; bench/attention_sweep.py tries a wider grid
CONFIGS = ((128, 64, 4, 3, "v1"), (128, 128, 8, 3, "v1"), (64, 64, 4, 4, "v1"),
           (128, 64, 4, 3, "tuned"), (128, 128, 8, 3, "tuned"), (128, 64, 8, 4, "tuned"), (128, 128, 8, 2, "tuned"))
CONFIGS += tuple((m, n, w, st, "tuned_ws") for m, n, w, st, _ in CONFIGS[3:5]) if WARP_SPECIALIZE else ()
# The config a head dim runs by default on CUDA (no first-call timing: one compile), measured by
# bench/attention_sweep.py on an H200 (16 x 8,910 x 64 bf16, Triton 3.6, 33 configs): (64, 64, 4, 3,
# "tuned") 0.706 ms, 0.88x cuDNN's 0.801 ms; every 128-row query block was slower (0.77-1.31 ms).
# Other head dims time CONFIGS at their first call (`_fastest`).
DEFAULT_CONFIGS = {64: (64, 64, 4, 3, "tuned")}
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


@triton.jit
def _tile(acc, acc_t, m_i, l_i, q, q_t, k_base, v_base, stride_kn, stride_vn, start_n, N, qk_scale,
          offs_n, offs_d, offs_t, HEAD_DIM: tl.constexpr, D_TAIL: tl.constexpr, MASKED: tl.constexpr):
    """One key/value block of the online softmax; MASKED only for the last, partial block."""
    cols = start_n + offs_n
    live = cols[:, None] < N
    k_ptrs = k_base + cols[:, None] * stride_kn
    if MASKED:
        k = tl.load(k_ptrs + offs_d[None, :], mask=live, other=0.0)
    else:
        k = tl.load(k_ptrs + offs_d[None, :])
    s = tl.dot(q, tl.trans(k))
    if D_TAIL > 0:  # the head dim past the power-of-2 main part, zero-padded to D_TAIL
        tail = offs_t[None, :] < HEAD_DIM
        if MASKED:
            tail = tail & live
        s += tl.dot(q_t, tl.trans(tl.load(k_ptrs + offs_t[None, :], mask=tail, other=0.0)))
    if MASKED:
        s = tl.where(cols[None, :] < N, s, float("-inf"))
    # log2 units: the scale (times log2 e) folded into one multiply-add per score
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v_ptrs = v_base + cols[:, None] * stride_vn
    if MASKED:
        v = tl.load(v_ptrs + offs_d[None, :], mask=live, other=0.0)
    else:
        v = tl.load(v_ptrs + offs_d[None, :])
    p16 = p.to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(p16, v)
    if D_TAIL > 0:
        tail = offs_t[None, :] < HEAD_DIM
        if MASKED:
            tail = tail & live
        acc_t = acc_t * alpha[:, None] + tl.dot(p16, tl.load(v_ptrs + offs_t[None, :], mask=tail, other=0.0))
    return acc, acc_t, m_new, l_i


@triton.jit
def _tuned_prologue(Q, sqb, sqh, sqn, K, skb, skh, V, svb, svh, N, H: tl.constexpr, D_MAIN: tl.constexpr,
                    D_TAIL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_MAIN)
    offs_t = D_MAIN + tl.arange(0, D_TAIL if D_TAIL > 0 else 16)
    q_rows = Q + b * sqb + h * sqh + offs_m[:, None] * sqn
    q = tl.load(q_rows + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    if D_TAIL > 0:
        q_t = tl.load(q_rows + offs_t[None, :], mask=(offs_m[:, None] < N) & (offs_t[None, :] < HEAD_DIM), other=0.0)
    else:  # never read: a power-of-2 head dim has no tail
        q_t = tl.zeros([BLOCK_M, 16], dtype=q.dtype)
    return b, h, offs_m, offs_n, offs_d, offs_t, q, q_t, K + b * skb + h * skh, V + b * svb + h * svh


@triton.jit
def _tuned_epilogue(O, sob, soh, son, b, h, offs_m, offs_d, offs_t, acc, acc_t, l_i, N, D_TAIL: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
    o_rows = O + b * sob + h * soh + offs_m[:, None] * son
    tl.store(o_rows + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < N)
    if D_TAIL > 0:
        tl.store(o_rows + offs_t[None, :], (acc_t / l_i[:, None]).to(O.dtype.element_ty),
                 mask=(offs_m[:, None] < N) & (offs_t[None, :] < HEAD_DIM))


@triton.jit
def _forward_tuned(Q, K, V, O, qk_scale, N,
                   stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                   H: tl.constexpr, HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b, h, offs_m, offs_n, offs_d, offs_t, q, q_t, k_base, v_base = _tuned_prologue(
        Q, stride_qb, stride_qh, stride_qn, K, stride_kb, stride_kh, V, stride_vb, stride_vh, N,
        H, D_MAIN, D_TAIL, HEAD_DIM, BLOCK_M, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_MAIN], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_M, D_TAIL if D_TAIL > 0 else 16], dtype=tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_full, BLOCK_N):
        acc, acc_t, m_i, l_i = _tile(acc, acc_t, m_i, l_i, q, q_t, k_base, v_base, stride_kn, stride_vn, start_n, N,
                                     qk_scale, offs_n, offs_d, offs_t, HEAD_DIM, D_TAIL, False)
    if n_full < N:
        acc, acc_t, m_i, l_i = _tile(acc, acc_t, m_i, l_i, q, q_t, k_base, v_base, stride_kn, stride_vn, n_full, N,
                                     qk_scale, offs_n, offs_d, offs_t, HEAD_DIM, D_TAIL, True)
    _tuned_epilogue(O, stride_ob, stride_oh, stride_on, b, h, offs_m, offs_d, offs_t, acc, acc_t, l_i, N, D_TAIL,
                    HEAD_DIM)


if WARP_SPECIALIZE:
    @triton.jit
    def _forward_tuned_ws(Q, K, V, O, qk_scale, N,
                          stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                          stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                          H: tl.constexpr, HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        b, h, offs_m, offs_n, offs_d, offs_t, q, q_t, k_base, v_base = _tuned_prologue(
            Q, stride_qb, stride_qh, stride_qn, K, stride_kb, stride_kh, V, stride_vb, stride_vh, N,
            H, D_MAIN, D_TAIL, HEAD_DIM, BLOCK_M, BLOCK_N)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D_MAIN], dtype=tl.float32)
        acc_t = tl.zeros([BLOCK_M, D_TAIL if D_TAIL > 0 else 16], dtype=tl.float32)
        n_full = (N // BLOCK_N) * BLOCK_N
        for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=True):
            acc, acc_t, m_i, l_i = _tile(acc, acc_t, m_i, l_i, q, q_t, k_base, v_base, stride_kn, stride_vn, start_n,
                                         N, qk_scale, offs_n, offs_d, offs_t, HEAD_DIM, D_TAIL, False)
        if n_full < N:
            acc, acc_t, m_i, l_i = _tile(acc, acc_t, m_i, l_i, q, q_t, k_base, v_base, stride_kn, stride_vn, n_full,
                                         N, qk_scale, offs_n, offs_d, offs_t, HEAD_DIM, D_TAIL, True)
        _tuned_epilogue(O, stride_ob, stride_oh, stride_on, b, h, offs_m, offs_d, offs_t, acc, acc_t, l_i, N,
                        D_TAIL, HEAD_DIM)


@triton.jit
def _tile_tma(acc, acc_t, m_i, l_i, q, q_t, dk, dk_t, dv, dv_t, start_n, N, qk_scale, offs_n,
              D_MAIN: tl.constexpr, D_TAIL: tl.constexpr, MASKED: tl.constexpr):
    """`_tile` with K and V through tensor descriptors (TMA on Hopper): rows past N and the head
    dim's tail past HEAD_DIM come back as zeros from the descriptor's bounds, so only the scores
    of the last block need the -inf mask."""
    s = tl.dot(q, tl.trans(dk.load([start_n, 0])))
    if D_TAIL > 0:
        s += tl.dot(q_t, tl.trans(dk_t.load([start_n, D_MAIN])))
    if MASKED:
        s = tl.where((start_n + offs_n)[None, :] < N, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = dv.load([start_n, 0])
    p16 = p.to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(p16, v)
    if D_TAIL > 0:
        acc_t = acc_t * alpha[:, None] + tl.dot(p16, dv_t.load([start_n, D_MAIN]))
    return acc, acc_t, m_new, l_i


if TENSOR_DESCRIPTORS:
    @triton.jit
    def _forward_tma(Q, K, V, O, qk_scale, N,
                     stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                     H: tl.constexpr, HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
        b, h, offs_m, offs_n, offs_d, offs_t, q, q_t, k_base, v_base = _tuned_prologue(
            Q, stride_qb, stride_qh, stride_qn, K, stride_kb, stride_kh, V, stride_vb, stride_vh, N,
            H, D_MAIN, D_TAIL, HEAD_DIM, BLOCK_M, BLOCK_N)
        dk = tl.make_tensor_descriptor(k_base, shape=[N, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, D_MAIN])
        dv = tl.make_tensor_descriptor(v_base, shape=[N, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, D_MAIN])
        if D_TAIL > 0:
            dk_t = tl.make_tensor_descriptor(k_base, shape=[N, HEAD_DIM], strides=[stride_kn, 1],
                                             block_shape=[BLOCK_N, D_TAIL])
            dv_t = tl.make_tensor_descriptor(v_base, shape=[N, HEAD_DIM], strides=[stride_vn, 1],
                                             block_shape=[BLOCK_N, D_TAIL])
        else:  # never read
            dk_t, dv_t = dk, dv
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D_MAIN], dtype=tl.float32)
        acc_t = tl.zeros([BLOCK_M, D_TAIL if D_TAIL > 0 else 16], dtype=tl.float32)
        n_full = (N // BLOCK_N) * BLOCK_N
        if WS:
            for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=True):
                acc, acc_t, m_i, l_i = _tile_tma(acc, acc_t, m_i, l_i, q, q_t, dk, dk_t, dv, dv_t, start_n, N,
                                                 qk_scale, offs_n, D_MAIN, D_TAIL, False)
        else:
            for start_n in range(0, n_full, BLOCK_N):
                acc, acc_t, m_i, l_i = _tile_tma(acc, acc_t, m_i, l_i, q, q_t, dk, dk_t, dv, dv_t, start_n, N,
                                                 qk_scale, offs_n, D_MAIN, D_TAIL, False)
        if n_full < N:
            acc, acc_t, m_i, l_i = _tile_tma(acc, acc_t, m_i, l_i, q, q_t, dk, dk_t, dv, dv_t, n_full, N,
                                             qk_scale, offs_n, D_MAIN, D_TAIL, True)
        _tuned_epilogue(O, stride_ob, stride_oh, stride_on, b, h, offs_m, offs_d, offs_t, acc, acc_t, l_i, N,
                        D_TAIL, HEAD_DIM)


def _tma_ready(q, k, v) -> None:
    """Tensor descriptors need 16-byte aligned bases and row strides: refuse (ValueError) before
    launching rather than fault on the device; and give Triton its scratch allocator once."""
    for t in (q, k, v):
        es = t.element_size()
        if t.data_ptr() % 16 or any(st * es % 16 for st in t.stride()[:3]):
            raise ValueError(f"tensor descriptors need 16-byte aligned bases and strides: {tuple(t.stride())}")
    if not getattr(_tma_ready, "allocator", False):
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=q.device))
        _tma_ready.allocator = True


def head_split(hd: int) -> tuple[int, int]:
    """hd -> (main, tail): the largest power of 2 <= hd (at least 16) and the rest padded up to a
    power of 2 of at least 16 (0 when hd is a power of 2): 64 -> (64, 0), 72 -> (64, 16)."""
    main = 1 << (hd.bit_length() - 1)
    rest = hd - main
    return main, 0 if rest == 0 else max(16, 1 << (rest - 1).bit_length())


def unavailable(q: torch.Tensor) -> str | None:
    """Why this kernel cannot take the call [B, H, N, hd] q, or None. A head dim that is not a
    power of 2 is declined: its padded tail (64 + 16 for 72) faulted with an illegal memory access
    on an H200 (Triton 3.6) though it reads in bounds under the interpreter, so it runs only where
    a config names it (bench/attention_sweep.py, each shape in its own process)."""
    hd = q.shape[-1]
    if hd not in (16, 32, 64, 128):
        return f"triton declined the call (head size {hd}: 16, 32, 64 or 128)"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"triton declined the call (dtype {q.dtype}: bfloat16 or float16)"
    return None


def _launch(q, k, v, o, scale, config):
    b, h, n, hd = q.shape
    bm, bn, warps, stages = config[:4]
    variant = config[4] if len(config) > 4 else "v1"
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3])
    qk_scale = scale * math.log2(math.e)
    grid = (triton.cdiv(n, bm), b * h)
    if variant == "v1":
        if hd & (hd - 1):
            raise ValueError(f"the v1 kernel takes a power-of-2 head dim, not {hd}")
        _forward[grid](q, k, v, o, qk_scale, n, *strides, H=h, HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn,
                       num_warps=warps, num_stages=stages)
        return
    if variant not in VARIANTS:
        raise ValueError(f"unknown Triton attention variant {variant!r} (this Triton has {', '.join(VARIANTS)})")
    main, tail = head_split(hd)
    if variant.startswith("tuned_tma"):
        _tma_ready(q, k, v)
        _forward_tma[grid](q, k, v, o, qk_scale, n, *strides, H=h, HEAD_DIM=hd, D_MAIN=main, D_TAIL=tail,
                           BLOCK_M=bm, BLOCK_N=bn, WS=variant == "tuned_tma_ws", num_warps=warps, num_stages=stages)
        return
    kernel = _forward_tuned if variant == "tuned" else _forward_tuned_ws
    kernel[grid](q, k, v, o, qk_scale, n, *strides, H=h, HEAD_DIM=hd, D_MAIN=main, D_TAIL=tail, BLOCK_M=bm,
                 BLOCK_N=bn, num_warps=warps, num_stages=stages)


def candidates(hd: int, configs=None) -> tuple:
    """The configs (default: CONFIGS as it is now) that can take head dim hd (v1 only at a power of 2)."""
    configs = CONFIGS if configs is None else configs
    return tuple(c for c in configs if (c[4] if len(c) > 4 else "v1") != "v1" or not hd & (hd - 1))


def _fastest(q, k, v, o, scale):
    """Each config timed on this call's operands (CUDA events, after one untimed call)."""
    best, best_ms = None, float("inf")
    for config in candidates(q.shape[-1]):
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
                    config: tuple | None = None) -> torch.Tensor:
    """config: (BLOCK_M, BLOCK_N, num_warps, num_stages[, variant]); default on CUDA: the head dim's
    DEFAULT_CONFIGS entry, else the fastest of CONFIGS for this shape (chosen once); (64, 64, 4, 2,
    "tuned") elsewhere (the interpreter)."""
    b, h, n, hd = q.shape
    if not (16 <= hd <= 128 and hd % 8 == 0) or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"flash_attention takes equal [B, H, N, hd] operands with hd a multiple of 8 in 16..128, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    # [B, N, H, hd] memory behind the [B, H, N, hd] view, as SDPA's fused kernels lay it out: the
    # caller's [N, H * hd] reshape after attention is then free
    o = torch.empty(b, n, h, hd, dtype=q.dtype, device=q.device).transpose(1, 2)
    scale = hd ** -0.5 if scale is None else scale
    if config is None:
        if hd & (hd - 1):
            raise ValueError(f"flash_attention chooses a config only for a power-of-2 head dim, not {hd} "
                             f"(the padded tail is named explicitly, as the sweep does)")
        key = (q.device, q.dtype, b, h, n, hd)
        if key not in _chosen:
            _chosen[key] = ((DEFAULT_CONFIGS.get(hd) or _fastest(q, k, v, o, scale)) if q.is_cuda
                            else (64, 64, 4, 2, "tuned"))
        config = _chosen[key]
    _launch(q, k, v, o, scale, config)
    return o
