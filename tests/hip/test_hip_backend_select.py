"""`--backend hip` on a machine that cannot run the kernels says so; it never falls back."""
from __future__ import annotations

import pytest
import torch

import engine.backend as backend
from engine.backend import hip_ops
from engine.errors import EngineInputError
from tensordiff.errors import BadInput


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the hip backend is available")
def test_hip_without_a_gpu_is_bad_input_with_a_reason():
    backend._CACHE.pop("hip", None)
    with pytest.raises(EngineInputError) as e:
        backend.get("hip")
    assert isinstance(e.value, BadInput)  # the CLI's exit 2
    assert "backend 'hip' is not available" in str(e.value)
    assert "CPU-only" in str(e.value) or "no GPU" in str(e.value)
    assert "hip" not in backend._CACHE


def test_reason_names_a_cpu_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    assert "CPU-only" in hip_ops.unavailable_reason()


def test_reason_names_a_missing_gpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no GPU" in hip_ops.unavailable_reason()


def test_unknown_kernel_fault_is_rejected_before_building(monkeypatch):
    monkeypatch.setattr(hip_ops, "load_kernels", lambda: pytest.fail("must not build"))
    with pytest.raises(EngineInputError, match="unknown kernel fault"):
        hip_ops.HipBackend(faults={"no-such-fault"})


def test_sources_digest_follows_every_source(tmp_path, monkeypatch):
    (tmp_path / "a.hip").write_text("x")
    (tmp_path / "portable.h").write_text("y")
    monkeypatch.setattr(hip_ops, "HIP_DIR", tmp_path)
    before = hip_ops.sources_digest()
    (tmp_path / "portable.h").write_text("z")  # a header change must rebuild, not reuse
    assert hip_ops.sources_digest() != before
