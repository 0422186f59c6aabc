"""The reference scale of a magnitude-aware tolerance: one streamed pass over A's finite elements."""
import math

import numpy as np
import pytest
import torch
from helpers_dumps import write

from tensordiff.judge import stream
from tensordiff.format.dump import open_dump
from tensordiff.judge.scale import rms, scaled
from tensordiff.judge.tolerance import DEFAULTS, Tolerance


def _stored(tmp_path, x):
    return open_dump(write(tmp_path / "d", {"x": x})).entries[0].stored


def test_rms_of_a_tensor_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr("tensordiff.judge.scale.CHUNK", 1000)  # several chunks, one short at the end
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


def test_a_memo_measures_each_reference_once_and_only_by_its_content(tmp_path, monkeypatch):
    """The pipeline's judge keeps the scales it measured: a case's comparison and its local error
    judge the same oracle tensor, which is read once; another content (sha256) is measured anew."""
    import tensordiff.judge.scale as sc

    calls = []
    real = sc.rms
    monkeypatch.setattr(sc, "rms", lambda st: calls.append(st.key) or real(st))
    e = open_dump(write(tmp_path / "d", {"x": torch.full((8,), 50.0)})).entries[0]
    tol, memo = Tolerance(atol=1e-4, rtol=1e-3, atol_scale="rms"), {}
    once = [scaled(tol, e.stored, memo, e.sha256) for _ in range(3)]
    assert len(calls) == 1
    fresh = scaled(tol, e.stored)  # measured without the memo: the same tolerance
    assert all(t == fresh for t in once) and len(calls) == 2
    f = open_dump(write(tmp_path / "e", {"x": torch.full((8,), 2.0)})).entries[0]
    assert scaled(tol, f.stored, memo, f.sha256).scale == pytest.approx(2.0) and len(calls) == 3
    scaled(tol, e.stored, memo, None)  # no content hash: never remembered
    assert len(calls) == 4


def test_each_judge_has_its_own_scales():
    from tensordiff.judge.contract import Contract
    from tensordiff.judge.judge import Judge

    a, b = Judge.build(Contract("m", ())), Judge.build(Contract("m", ()))
    assert a.scales == {} and a.scales is not b.scales and a == b  # the memo is no part of a judge's identity
