"""The engine's tower pieces: rope layout, padding invisibility, faults at unit level."""
from __future__ import annotations

import math

import pytest
import torch

from engine.deepseek_v41_flash.rope import rope_tables
from engine.deepseek_v41_flash.run import VisionEngine
from engine.deepseek_v41_flash.vision import pad_patch_rows
from engine.errors import EngineInputError
from tensordiff.format.capture import MemoryRecorder
from tensordiff.pipeline.inputs import default_image_path
from tensordiff.models.deepseek_v41_flash.synthetic import resolve


def test_rope_tables_blocked_and_interleaved():
    cos, sin = rope_tables(2, 3, 8, 10000.0)
    f = [10000 ** (-j / 8) for j in (0, 2, 4, 6)]
    want = [1 * x for x in f] + [2 * x for x in f]  # patch (1, 2)
    assert torch.allclose(cos[5], torch.tensor([math.cos(a) for a in want]), atol=1e-6)
    assert torch.allclose(sin[5], torch.tensor([math.sin(a) for a in want]), atol=1e-6)
    icos, _ = rope_tables(2, 3, 8, 10000.0, interleaved=True)
    inter = [a for pair in zip(want[:4], want[4:]) for a in pair]
    assert torch.allclose(icos[5], torch.tensor([math.cos(a) for a in inter]), atol=1e-6)


def test_patch_padding_is_zero_unless_faulted():
    rows = torch.randn(3, 588).to(torch.bfloat16)
    padded = pad_patch_rows(rows, 592)
    assert padded.shape == (3, 592) and torch.equal(padded[:, :588], rows) and not padded[:, 588:].any()
    assert pad_patch_rows(rows, 592, nonzero=True)[:, 588:].all()


@pytest.fixture(scope="module")
def wdir():
    return resolve("synthetic:tiny")


def test_engine_taps_and_padding_leave_numbers_alone(wdir):
    eng = VisionEngine(wdir)
    assert eng.tower.w.patch_w.shape[1] == 592 and not eng.tower.w.patch_w[:, 588:].any()
    plan, patches = eng.preprocess(default_image_path())
    rec = MemoryRecorder()
    with torch.inference_mode():
        out = eng.encode(patches, plan, rec)
        quiet = eng.encode(patches, plan, None)
    assert list(rec.tensors) == ["patches", "rope.cos", "rope.sin", "block0", "final_norm", "aligner"]
    assert rec.tensors["patches"].shape == (51 * 74, 588)
    assert torch.equal(out, quiet) and out.shape == (17 * 25, eng.cfg.dim)
    span = eng.span(3, out, plan)
    assert span.length == plan.span == 444


def test_unknown_fault_and_dtype_are_refused(wdir):
    with pytest.raises(EngineInputError, match="unknown fault"):
        VisionEngine(wdir, fault="nope")
    with pytest.raises(EngineInputError, match="dtype"):
        VisionEngine(wdir, dtype="float16")


def test_missing_tensor_is_named(wdir, tmp_path):
    import json
    import shutil

    for f in wdir.iterdir():
        shutil.copy(f, tmp_path / f.name)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["vision.blocks.1.mlp.w2.weight"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(EngineInputError, match="vision.blocks.1.mlp.w2.weight"):
        VisionEngine(tmp_path)
