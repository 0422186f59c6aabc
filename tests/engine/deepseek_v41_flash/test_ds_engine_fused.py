"""The compiled block (CUDA's speed path) holds the oracle's numbers: forced on here on the CPU
through Inductor's C++ backend, so CI checks the same segments the GPU runs (there through
Triton; `bash bench/gpu.sh OUT checks` is the GPU run)."""
from __future__ import annotations

import pytest
import torch

import engine.deepseek_v41_flash.fused as fused
import engine.runtime.fused as runtime_fused
import engine.deepseek_v41_flash.run as run_mod
from engine.backend import get as get_backend
from engine.deepseek_v41_flash.run import VisionEngine
from engine.deepseek_v41_flash.vision import VisionBlock
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.runs import make_request, run_side
import tensordiff.models.deepseek_v41_flash.faults as D
from tensordiff.models.deepseek_v41_flash.synthetic import resolve


@pytest.fixture
def forced_fusion(monkeypatch):
    made = []
    real = fused.FusedBlock

    class Counting(real):
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(run_mod, "can_compile", lambda device: True)
    monkeypatch.setattr(fused, "FusedBlock", Counting)
    monkeypatch.setenv("TENSORDIFF_FUSE", "1")
    return made


@pytest.mark.parametrize("fault,earliest", [(None, []), (D.PATCH_PAD_NONZERO, ["block0"])])
def test_compiled_block_matches_the_oracle(tmp_path, forced_fusion, fault, earliest):
    ad, req = make_request("deepseek-v4.1-flash", fault=fault)
    oracle = run_side(ad, "oracle", make_request("deepseek-v4.1-flash")[1], tmp_path / "oracle")
    engine = run_side(ad, "engine", req, tmp_path / "engine")
    assert forced_fusion, "the compiled block was not used"
    assert compare_dumps(oracle, engine).earliest == earliest


def test_compiled_run_says_so_in_the_manifest(tmp_path, forced_fusion):
    ad, req = make_request("deepseek-v4.1-flash")
    sp = open_dump(run_side(ad, "engine", req, tmp_path / "engine")).run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "on", "policy": "on", "ran": "compiled"}
    assert sp["fallbacks"] == []


class _OtherBackend:
    """A backend that is not `torch` (as hip is): the torch ops under another name."""

    name = "other"

    def __getattr__(self, op):
        return getattr(get_backend("torch"), op)


@pytest.mark.parametrize("backend,heads_major,pieces", [("torch", False, ["attn_in", "out"]),
                                                       ("torch", True, [None, "out"]),
                                                       ("other", False, ["attn_residual", "ffn_residual"])])
def test_the_compiled_route_compiles_the_blocks_own_pieces(monkeypatch, backend, heads_major, pieces):
    seen = []
    monkeypatch.setattr(runtime_fused, "_compile", lambda fn: seen.append(fn) or fn)  # an identity "compiler"
    eng = VisionEngine(resolve("synthetic:tiny"))
    block = VisionBlock(eng.cfg, get_backend("torch") if backend == "torch" else _OtherBackend(), eng.tower.attend)
    fb = fused.FusedBlock(block, heads_major=heads_major)
    # the eager block's own bound methods, nothing re-typed (heads-major: attn_in behind a layout copy)
    wrapped = [fn.__closure__[0].cell_contents if p is None else fn for fn, p in zip(seen, pieces)]
    assert len(seen) == 2 and wrapped == [getattr(block, p or "attn_in") for p in pieces]
    x = torch.randn(12, eng.cfg.vision_dim, generator=torch.Generator().manual_seed(0))
    cos, sin = eng.tower.rope((3, 4), x.device)
    blk = eng.tower.w.blocks[0]
    # compiled by the identity, the compiled route is the eager one bit for bit
    assert torch.equal(fb(x, blk, cos, sin), block(x, blk, cos, sin)) and fb.ok and fb.error is None
