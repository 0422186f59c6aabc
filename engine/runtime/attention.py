"""Attention over packed sequences: [N, H, hd] in, [N, H, hd] out, through 4-D SDPA.

PyTorch's fused attention kernels (flash, memory-efficient, cuDNN) accept only 4-D
[B, H, N, hd] operands; a 3-D call silently runs the math path, which materialises the N x N
score matrix (the official DeepSeek tower does that: 674 ms vs 62 ms at 8,910 patches on an
H200). So everything here goes through a 4-D call with B = 1, built from strided views (no
copies of q, k or v). On CUDA the kernel order is cuDNN, flash, efficient, math: the first that
supports the call runs.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover - older torch: let PyTorch choose
    SDPBackend = None
    sdpa_kernel = None


def _kernel_context(backends):
    """The allowed kernels, tried in the given order where torch supports an order."""
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:  # torch < 2.6: the set only, in PyTorch's own order
        return sdpa_kernel(backends)

# Names accepted by `prefer`, in the default CUDA order.
KERNELS = ("cudnn", "flash", "efficient", "math")
# Also accepted by `prefer`, never in the default order: our Triton kernel (`triton_attention`)
OWN_KERNELS = ("triton",)


def _backends(prefer: Sequence[str]):
    table = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    return [getattr(SDPBackend, table[name]) for name in prefer if name in table and hasattr(SDPBackend, table[name])]


# kernels that raised at run time in this process, with why: not asked for again
_BROKEN: dict[str, str] = {}

# `torch._fused_sdp_choice` answers with SDPBackend's integer values
_CHOICE = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
# what each name is switched by (torch.backends.cuda.<flag>() also governs the CPU's flash kernel)
_FLAGS = {"flash": "flash_sdp_enabled", "efficient": "mem_efficient_sdp_enabled", "cudnn": "cudnn_sdp_enabled",
          "math": "math_sdp_enabled"}
CPU_ORDER = ("flash", "math")  # PyTorch's own choice on the CPU: its flash kernel, else math


def _ran(q4, k4, v4, scale) -> str:
    """The kernel SDPA dispatches this call to, under the kernel context now in force."""
    try:
        return _CHOICE.get(int(torch._fused_sdp_choice(q4, k4, v4, scale=scale)), "unknown")
    except (AttributeError, RuntimeError, TypeError):  # a torch without the query
        return "unknown"


def _declined(name: str) -> str:
    flag = getattr(torch.backends.cuda, _FLAGS.get(name, ""), None)
    if flag is not None and not flag():
        return f"{name} is disabled (torch.backends.cuda.{_FLAGS[name]}() is False)"
    return f"{name} declined the call (its dtype, head size, layout or device is not supported)"


def _note(log, q4, k4, v4, scale, order) -> None:
    """Tell `log` which kernel runs, and why the first one asked for did not when it did not."""
    if log is None:
        return
    ran = _ran(q4, k4, v4, scale)
    log.kernel(ran)
    asked = [n for n in order if n not in _BROKEN]
    for name in order:
        if name in _BROKEN:
            log.fallback(f"sdpa {name} skipped", f"it raised earlier in this process: {_BROKEN[name]}")
    if asked and ran not in ("unknown", asked[0]):
        ahead = asked[:asked.index(ran)] if ran in asked else asked
        log.fallback(f"sdpa {asked[0]} -> {ran}", "; ".join(_declined(n) for n in ahead))


def _sdpa(q4, k4, v4, scale, prefer, log=None):
    if sdpa_kernel is None or q4.device.type != "cuda":
        _note(log, q4, k4, v4, scale, CPU_ORDER)
        return F.scaled_dot_product_attention(q4, k4, v4, scale=scale)
    order = list(prefer or KERNELS)
    names = [n for n in order if n not in _BROKEN]
    if names and names[0] == "triton":
        o = _triton(q4, k4, v4, scale, log)
        if o is not None:
            return o
        # declined or broken (the reason is in the log): the rest of the order takes the call
        return _sdpa(q4, k4, v4, scale, [n for n in order if n != "triton"] or list(KERNELS), log)
    try:
        with _kernel_context(_backends(names)):
            _note(log, q4, k4, v4, scale, order)
            return F.scaled_dot_product_attention(q4, k4, v4, scale=scale)
    except RuntimeError as e:
        # a kernel that accepted the call can still fail inside (cuDNN graph build): drop the
        # first choice for this process and let the next one take the call
        if len(names) < 2:
            raise
        text = str(e).strip()
        _BROKEN[names[0]] = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
        return _sdpa(q4, k4, v4, scale, order, log)  # `names` now leaves the broken one out


def _triton(q4, k4, v4, scale, log):
    """Our Triton kernel's output, or None when it cannot take the call or raises (then it is
    dropped for this process, as a failing SDPA kernel is)."""
    try:
        from . import triton_attention
    except ImportError as e:
        why = f"Triton is not importable ({e})"
    else:
        why = triton_attention.unavailable(q4)
        if why is None:
            try:
                o = triton_attention.flash_attention(q4, k4, v4, scale)
            except Exception as e:  # noqa: BLE001 - a compile or launch failure: the next kernel runs
                text = str(e).strip()
                _BROKEN["triton"] = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
                why = f"it raised: {_BROKEN['triton']}"
            else:
                if log is not None:
                    log.kernel("triton")
                return o
    if log is not None:
        log.fallback("attention triton -> sdpa", why)
    return None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              cu_seqlens: Sequence[int] | None = None, prefer: Sequence[str] | None = None,
              log=None) -> torch.Tensor:
    """Full (bidirectional) attention. q, k, v: [N, H, hd] with a unit last stride.

    cu_seqlens: optional host list of sequence boundaries [0, n1, n1+n2, ..., N]; each sequence
    attends only within itself (several images packed in one call); equal segments run as one
    batched call, unequal ones one call each. Default scale 1/sqrt(hd).
    prefer: CUDA kernel names from KERNELS (and OWN_KERNELS) to try, in order.
    log: a `speed_path.SpeedPath` (or None) told which kernel each call ran and every fallback.
    Returns [N, H, hd], a view of the kernel's output (the fused kernels lay it out [1, N, H, hd],
    so a following reshape to [N, H * hd] is free there).
    """
    if cu_seqlens is None:
        bounds = [0, q.shape[0]]
    else:
        bounds = [int(b) for b in cu_seqlens]
        assert bounds[0] == 0 and bounds[-1] == q.shape[0], bounds
    lengths = {b - a for a, b in zip(bounds[:-1], bounds[1:])}
    if len(bounds) > 2 and len(lengths) == 1:
        # equal segments (the frames of one grid): one batched call over [S, H, n, hd] views, each
        # batch row attending within itself, instead of S launches
        s, n = len(bounds) - 1, lengths.pop()
        q4, k4, v4 = (t.view(s, n, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        o = _sdpa(q4, k4, v4, scale, prefer, log)  # [S, H, n, hd]
        return o.transpose(1, 2).reshape(q.shape)
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        # [n, H, hd] -> [1, H, n, hd]: a strided view, no copy
        q4, k4, v4 = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = _sdpa(q4, k4, v4, scale, prefer, log)  # [1, H, n, hd]
        outs.append(o.squeeze(0).transpose(0, 1))
    return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
