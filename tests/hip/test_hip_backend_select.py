"""`--backend hip` on a machine that cannot run the kernels says so; it never falls back. The
router's routes are checked before any build: a removed one is refused with one line."""
from __future__ import annotations

import re

import pytest
import torch

import engine.backend as backend
from engine.backend import hip_ops
from engine.errors import EngineInputError
from tensordiff.errors import BadInput
from tests.hip.removed_routes import removed_router_routes


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


# --- the router's routes: checked before anything is built, so on any machine ---------------

REMOVED = removed_router_routes()


@pytest.mark.parametrize("name,code", REMOVED, ids=[n for n, _ in REMOVED])
def test_a_removed_router_route_is_refused_by_name_and_by_code(monkeypatch, name, code):
    monkeypatch.setattr(hip_ops, "load_kernels", lambda: pytest.fail("must not build"))
    for asked in (name, code):
        with pytest.raises(EngineInputError) as e:
            hip_ops.HipBackend(router_threads=asked)
        msg = str(e.value)
        assert isinstance(e.value, BadInput) and "\n" not in msg  # the CLI's one line, exit 2
        assert f"router_threads {asked!r} is not a router route" in msg
        assert "the routes are wave, wave_lb" in msg


def test_every_router_route_is_accepted_with_the_kernels_code(monkeypatch):
    monkeypatch.setattr(hip_ops, "load_kernels", lambda: "kernels")
    for asked in (0, 64, 128, 256, *hip_ops.ROUTER_ROUTES):
        be = hip_ops.HipBackend(router_threads=asked)
        assert be._router_code == hip_ops.ROUTER_ROUTES.get(asked, asked)
        assert be.with_faults(()).router_threads == asked


def test_the_named_routes_are_the_kernels_and_no_removed_code_is_reused():
    # hip/moe_route.hip's `constexpr int kRouteWaveLb = -2;` is route "wave_lb", code -2
    src = (hip_ops.HIP_DIR / "moe_route.hip").read_text()
    kernel = {re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower(): int(c)
              for n, c in re.findall(r"constexpr int kRoute(\w+) = (-\d+);", src)}
    # the values recorded runs used
    assert kernel == hip_ops.ROUTER_ROUTES == {"wave": -1, "wave_lb": -2, "filter": -6, "filter_redux": -7,
                                               "filter_g16": -11, "exact_bf16": -13}
    assert not {c for _, c in REMOVED} & set(kernel.values())
    assert not {n for n, _ in REMOVED} & set(kernel)
