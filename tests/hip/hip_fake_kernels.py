"""A stand-in for the compiled kernel module, on the CPU: the binding's entry points with the
binding's own argument checks, computed by the torch reference ops.

It lets the HipBackend's Python layer (argument preparation, dtype and layout handling) run
under the real engines on a machine without a GPU, so a caller that hands the hip backend
something the kernels would refuse fails here, in CI, rather than on the GPU machine.
"""
from __future__ import annotations

import torch

from engine.backend.torch_ops import TorchBackend

REF = TorchBackend()
FLOATS = (torch.float32, torch.bfloat16)


def _require(t: torch.Tensor, name: str, dtype=None) -> None:
    # bindings.cpp: require(t, name[, dtype])
    assert t.is_contiguous(), f"{name} must be contiguous"
    if dtype is not None:
        assert t.dtype == dtype, f"{name} must be {dtype}, not {t.dtype}"


def _float(t: torch.Tensor) -> None:
    assert t.dtype in FLOATS, f"kernels take float32 or bfloat16, not {t.dtype}"


class FakeKernels:
    calls: list[str]

    def __init__(self):
        self.calls = []

    def rms_norm(self, x, w, eps, stream):
        self.calls.append("rms_norm")
        _require(x, "x")
        _float(x)
        _require(w, "weight", torch.float32)
        assert w.numel() == x.shape[-1]
        return REF.rms_norm(x, w, eps)

    def rope_rotate_half(self, x, cos, sin, n_pos, heads, max_access_bytes, stream):
        self.calls.append("rope_rotate_half")
        _require(x, "x")
        _float(x)
        _require(cos, "cos", torch.float32)
        _require(sin, "sin", torch.float32)
        assert cos.shape == sin.shape and cos.numel() == n_pos * cos.shape[-1]
        assert x.shape[-3:-1] == (n_pos, heads)
        return REF.rope_rotate_half(x, cos, sin)

    def patch_gemm(self, x, w, bias, stream):
        self.calls.append("patch_gemm")
        _require(x, "x")
        _float(x)
        _require(w, "weight", x.dtype)
        assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1]
        assert x.shape[1] % 16 == 0, "K is not a multiple of 16"
        if bias is not None:
            _require(bias, "bias", torch.float32)
        y = x.float() @ w.float().T
        return (y if bias is None else y + bias).to(x.dtype)

    def aligner_gather(self, x, index, stream):
        self.calls.append("aligner_gather")
        _require(x, "x")
        _require(index, "index", torch.int32)
        assert x.dim() == 2 and index.dim() == 2 and index.shape[1] == 9
        return REF.aligner_gather(x, index)

    def moe_route(self, logits, bias, bias_vl, image_rows, topk, route_scale, fault, threads, stream):
        self.calls.append("moe_route")
        _require(logits, "logits")
        _float(logits)
        _require(bias, "bias", torch.float32)
        if bias_vl is not None:
            _require(bias_vl, "bias_vl", torch.float32)
        if image_rows is not None:
            _require(image_rows, "image_rows", torch.uint8)
        rows = None if image_rows is None or fault else image_rows.bool()
        return REF.moe_route(logits, bias, bias_vl, rows, topk, route_scale)

    def embed_scatter(self, emb, rows, src, stream):
        self.calls.append("embed_scatter")
        _require(emb, "emb")
        _require(rows, "rows", torch.int64)
        _require(src, "src")
        _float(emb)
        _float(src)
        return REF.embed_scatter(emb, rows, src)


def install(monkeypatch) -> FakeKernels:
    """Route engine.backend.get("hip") to a HipBackend over FakeKernels on the CPU."""
    import contextlib

    import engine.backend as backend
    from engine.backend import hip_ops

    fake = FakeKernels()
    monkeypatch.setattr(hip_ops, "load_kernels", lambda: fake)
    monkeypatch.setattr(hip_ops, "_gpu", lambda t, what: None)
    monkeypatch.setattr(hip_ops, "_stream", lambda t: 0)
    monkeypatch.setattr(hip_ops, "_on_device", lambda t: contextlib.nullcontext())
    monkeypatch.setitem(backend._CACHE, "hip", hip_ops.HipBackend())
    return fake
