"""Attention over packed segments: equal segments (the frames of one grid) run as one batched call
that gives the per-segment calls' numbers bit for bit, and each segment still attends only within
itself (the batched view must not let one frame see another)."""
from __future__ import annotations

import pytest
import torch

from engine.runtime.attention import attention
from engine.runtime.speed_path import SpeedPath


def _qkv(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 4, 16, generator=g).to(dtype) for _ in range(3)]


def _masked(q, k, v, bounds):
    """Block-diagonal attention written out: the reference semantics."""
    seg = torch.zeros(q.shape[0], dtype=torch.long)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        seg[a:b] = i
    s = torch.einsum("nhd,mhd->hnm", q.double(), k.double()) / q.shape[-1] ** 0.5
    s = s.masked_fill(seg[:, None] != seg[None, :], float("-inf"))
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equal_segments_batched_equal_the_per_segment_calls(dtype):
    q, k, v = _qkv(3 * 40, dtype)
    bounds = [0, 40, 80, 120]
    log = SpeedPath()
    out = attention(q, k, v, cu_seqlens=bounds, log=log)
    one_by_one = torch.cat([attention(q[a:b], k[a:b], v[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(out, one_by_one)
    assert sum(log.attention.values()) == 1  # one call for the three frames


def test_segments_attend_only_within_themselves():
    q, k, v = _qkv(3 * 40, torch.float32, seed=1)
    for bounds in ([0, 40, 80, 120], [0, 30, 120]):  # batched, and one call per segment
        out = attention(q, k, v, cu_seqlens=bounds)
        assert torch.allclose(out.double(), _masked(q, k, v, bounds), atol=1e-5), bounds
    # the planted fault these tests guard against: attending across frames gives other numbers
    assert not torch.allclose(attention(q, k, v), attention(q, k, v, cu_seqlens=[0, 40, 80, 120]), atol=1e-3)


def test_a_strided_input_is_batched_as_its_values():
    # q, k, v as views of one [N, 3, H, hd] GEMM output (the DeepSeek tower's layout)
    qkv = torch.randn(2 * 24, 3, 4, 16, generator=torch.Generator().manual_seed(2))
    q, k, v = qkv.unbind(1)
    bounds = [0, 24, 48]
    assert torch.equal(attention(q, k, v, cu_seqlens=bounds),
                       attention(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens=bounds))


def _cuda_q():
    import types

    return types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"), shape=(1, 2, 8, 64),
                                 dtype=torch.bfloat16)


def test_triton_first_runs_our_kernel_and_a_failing_one_is_dropped(monkeypatch):
    """`triton` in the kernel order runs our kernel; one that raises is dropped for the process,
    the call goes to the next kernel and the speed path says why."""
    import sys
    import types

    import engine.runtime.attention as A

    calls = []
    fake = types.ModuleType("engine.runtime.triton_attention")
    fake.unavailable = lambda q: None
    fake.flash_attention = lambda q, k, v, scale=None: calls.append("triton") or "ran with triton"
    monkeypatch.setitem(sys.modules, "engine.runtime.triton_attention", fake)
    monkeypatch.setattr(A, "_BROKEN", {})
    monkeypatch.setattr(A, "_note", lambda log, *a: log.kernel("cudnn") if log is not None else None)
    monkeypatch.setattr(A.F, "scaled_dot_product_attention", lambda q, k, v, scale=None: "ran with sdpa")
    q = _cuda_q()
    log = SpeedPath()
    assert A._sdpa(q, q, q, None, ["triton", "cudnn"], log) == "ran with triton"
    assert log.attention == {"triton": 1} and log.fallbacks == []

    def broken(q, k, v, scale=None):
        raise RuntimeError("triton: out of shared memory")
    fake.flash_attention = broken
    assert A._sdpa(q, q, q, None, ["triton", "cudnn"], log) == "ran with sdpa"
    assert A._BROKEN == {"triton": "RuntimeError: triton: out of shared memory"}
    assert log.fallbacks == [{"what": "attention triton -> sdpa",
                              "why": "it raised: RuntimeError: triton: out of shared memory"}]
    # not asked again in this process
    fake.flash_attention = lambda *a, **k: pytest.fail("a dropped kernel was asked again")
    assert A._sdpa(q, q, q, None, ["triton", "cudnn"], None) == "ran with sdpa"


def test_triton_declining_a_call_hands_it_on_and_says_why(monkeypatch):
    import sys
    import types

    import engine.runtime.attention as A

    fake = types.ModuleType("engine.runtime.triton_attention")
    fake.unavailable = lambda q: "triton declined the call (head size 72: 16, 32, 64 or 128)"
    fake.flash_attention = lambda *a, **k: pytest.fail("a declined call ran")
    monkeypatch.setitem(sys.modules, "engine.runtime.triton_attention", fake)
    monkeypatch.setattr(A, "_BROKEN", {})
    monkeypatch.setattr(A, "_note", lambda log, *a: None)
    monkeypatch.setattr(A.F, "scaled_dot_product_attention", lambda q, k, v, scale=None: "ran with sdpa")
    log = SpeedPath()
    assert A._sdpa(_cuda_q(), None, None, None, ["triton"], log) == "ran with sdpa"
    assert log.fallbacks == [{"what": "attention triton -> sdpa",
                              "why": "triton declined the call (head size 72: 16, 32, 64 or 128)"}]
    assert A._BROKEN == {}  # declining is not breaking: the next call may fit
