"""The clean DeepSeek V4.1 Flash engine matches the oracle at every boundary, on every picture.

fp32 on CPU (the comparator's default fp32 tolerances, no element outside); bf16 on one small
picture. The collapse branches of the budget solve (50000x40, 40x50000) are compared at the
preprocessing level: ~9,000 patches each through the oracle's math-path attention would cost
more than the rest of the suite.
"""
from __future__ import annotations

import pytest
import torch

from deepseek_images import COLLAPSE, IMAGES, image_path
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.pipeline.runs import make_request, run_side

MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def pictures(module_tmp):
    return module_tmp("ds-pictures")


def dumps(tmp_path, image, dtype="float32", fault=None):
    adapter, req = make_request(MODEL, image=image, weights="synthetic:tiny", dtype=dtype, fault=fault)
    oracle = run_side(adapter, "oracle", req.__class__(**{**req.__dict__, "fault": None}), tmp_path / "oracle")
    engine = run_side(adapter, "engine", req, tmp_path / "engine")
    return oracle, engine


@pytest.mark.parametrize("name", list(IMAGES))
def test_clean_engine_matches_oracle_fp32(name, pictures, tmp_path):
    oracle, engine = dumps(tmp_path, image_path(name, pictures))
    report = compare_dumps(oracle, engine)
    assert report.verdict == "match", str(report)
    assert [b.name for b in report.boundaries] == ["plan", "patches", "rope", "block0", "final_norm", "aligner"]
    assert all(b.status == "match" for b in report.boundaries)


@pytest.mark.parametrize("name", ["rgba"])
def test_clean_engine_matches_oracle_bf16(name, pictures, tmp_path):
    oracle, engine = dumps(tmp_path, image_path(name, pictures), dtype="bfloat16")
    report = compare_dumps(oracle, engine)
    assert report.verdict == "match", str(report)


@pytest.mark.parametrize("name", list(COLLAPSE))
def test_collapse_branches_preprocess_identically(name, pictures):
    from engine.deepseek_v41_flash.run import VisionEngine
    from oracle.deepseek_v41_flash.config import ModelArgs
    from oracle.deepseek_v41_flash.image_processor import load_image
    from tensordiff.models.deepseek_v41_flash.synthetic import resolve

    wdir = resolve("synthetic:tiny")
    path = image_path(name, pictures)
    patches, gh, gw, ch, cw = load_image(path, ModelArgs.from_dir(wdir))
    plan, rows = VisionEngine(wdir).preprocess(path)
    assert plan.budget_solved and plan.span == 1024
    assert plan.grid == (gh, gw) and plan.cells == (ch, cw)
    assert rows.dtype == torch.bfloat16 and torch.equal(rows, patches.flatten(1))
