"""The compiled block (CUDA's speed path) holds the oracle's numbers: forced on here on the CPU
through Inductor's C++ backend, so CI checks the same segments the GPU runs (there through
Triton; see bench/h200_checks.sh for the GPU run)."""
from __future__ import annotations

import pytest

import engine.deepseek_v41_flash.fused as fused
import engine.deepseek_v41_flash.run as run_mod
from tensordiff.compare import compare_dumps
from tensordiff.runs import make_request, run_side
from tensordiff.models import deepseek_faults as D


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
