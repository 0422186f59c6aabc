"""The reference scale of a magnitude-aware tolerance: one streamed pass over A's finite elements."""
import math

import numpy as np
import pytest
import torch
from helpers_dumps import write

from tensordiff import stream
from tensordiff.dump import open_dump
from tensordiff.scale import rms, scaled
from tensordiff.tolerance import DEFAULTS, Tolerance


def _stored(tmp_path, x):
    return open_dump(write(tmp_path / "d", {"x": x})).entries[0].stored


def test_rms_of_a_tensor_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr("tensordiff.scale.CHUNK", 1000)  # several chunks, one short at the end
    x = torch.randn(37, 101, generator=torch.Generator().manual_seed(1)) * 40
    assert rms(_stored(tmp_path, x)) == pytest.approx(float(x.double().pow(2).mean().sqrt()), rel=1e-12)


def test_rms_skips_non_finite_and_reads_bfloat16(tmp_path):
    x = torch.tensor([3.0, -4.0, float("nan"), float("inf")])
    assert rms(_stored(tmp_path / "f", x)) == pytest.approx(math.sqrt(12.5))
    assert rms(_stored(tmp_path / "b", x.bfloat16())) == pytest.approx(math.sqrt(12.5))
    assert rms(_stored(tmp_path / "n", torch.tensor([float("nan")]))) == 0.0


def test_scaled_measures_only_what_declares_a_scale(tmp_path):
    st = _stored(tmp_path, torch.full((8,), 50.0))
    plain = DEFAULTS["float32"]
    assert scaled(plain, st) is plain and plain.effective_atol == plain.atol
    t = scaled(Tolerance(atol=1e-4, rtol=1e-3, atol_scale="rms"), st)
    assert t.scale == pytest.approx(50.0) and t.effective_atol == pytest.approx(5e-3)
    # below 1 the scale never tightens atol: small tensors keep the absolute floor
    small = scaled(Tolerance(atol=1e-4, rtol=1e-3, atol_scale="rms"), _stored(tmp_path / "s", torch.full((8,), 0.01)))
    assert small.effective_atol == 1e-4
