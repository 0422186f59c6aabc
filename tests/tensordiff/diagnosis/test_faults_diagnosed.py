"""The done-when of the diagnosis: every planted fault whose nature is a layout gets the right
diagnosis in its report (`tensordiff check`'s route: `pipeline.check`), the clean engines get
none, and numeric faults get none, or only a scale when the fault truly is one."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import tensordiff.models.deepseek_v41_flash.faults as D
import tensordiff.models.qwen3_vl.faults as Q
from tensordiff.pipeline.case import CaseSpec, check
from tensordiff.reports.text import render_text

# every case here is the float32 route (one pass, exact numerics on both halves); a run with no
# --dtype is the model's official dtype, semantic + numeric

DEEPSEEK, QWEN = "deepseek-v4.1-flash", "qwen3-vl"


def _diagnosis(case):
    r = case.report
    assert r.verdict == "diverged"
    (root,) = r.earliest
    return root, r.boundary(root).diagnosis, render_text(r)


@pytest.mark.parametrize("model,fault,boundary,name,text", [
    (DEEPSEEK, D.ROPE_INTERLEAVED, "rope", "interleaved-halves", "interleaved vs blocked RoPE angles"),
    (DEEPSEEK, D.ALIGNER_FLAT_PAD, "aligner", "pad-misplaced", "padding appended to the flat sequence"),
    (DEEPSEEK, D.CONTAIN_CEIL, "plan", "resize-by-one", "content_h 710 vs A's 709 (+1)"),
    (QWEN, Q.MERGE_ORDER_RASTER, "patches", "merge-vs-raster", "plain raster order"),
    (QWEN, Q.ROPE_HW_SWAP, "rope", "swapped-halves", "height and width"),
])
def test_each_layout_fault_gets_its_diagnosis(model, fault, boundary, name, text):
    root, diag, shown = _diagnosis(check(CaseSpec(model, dtype="float32", fault=fault)))
    assert root == boundary
    assert diag and {f["name"] for f in diag} == {name}, diag
    assert all(f["explained"] >= 0.95 for f in diag)
    assert text in diag[0]["text"] and f"diagnosis: {diag[0]['line']}" in shown


def test_a_resize_rounded_up_to_the_factor_is_a_size_finding(tmp_path):
    img = tmp_path / "rounding.png"  # 112x80: 80 / 32 = 2.5 -> 64 by rounding, 96 by ceil
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 112, 3), dtype=np.uint8)).save(img)
    root, diag, _ = _diagnosis(check(CaseSpec(QWEN, dtype="float32", image=img, fault=Q.RESIZE_CEIL_SIDES)))
    assert root == "plan" and [f["name"] for f in diag] == ["size-differs"]
    assert "+32" in diag[0]["text"]


@pytest.mark.parametrize("model", [DEEPSEEK, QWEN])
def test_the_clean_engine_gets_no_diagnosis(model):
    r = check(CaseSpec(model, dtype="float32")).report
    assert r.verdict == "match"
    assert r.as_json()["diagnosis"] == {} and "diagnosis:" not in render_text(r)


@pytest.mark.parametrize("model,fault", [
    (DEEPSEEK, D.GELU_TANH), (DEEPSEEK, D.RESIDUAL_SCALE), (DEEPSEEK, D.PATCH_PAD_NONZERO),
    (DEEPSEEK, D.SPLITK_BF16), (QWEN, Q.MERGER_GELU_TANH), (QWEN, Q.POSEMBED_ALIGN_CORNERS_FALSE),
])
def test_a_numeric_fault_gets_no_simple_explanation(model, fault):
    _, diag, shown = _diagnosis(check(CaseSpec(model, dtype="float32", fault=fault)))
    assert diag == [] and "diagnosis: no simple explanation" in shown


@pytest.mark.parametrize("model,fault,extra,name,text", [
    (DEEPSEEK, D.TAIL_ROW_SCALE, {}, "row-scale", "row 3773 (patch (y=50, x=73)) scaled by 1.0156"),
    (DEEPSEEK, D.NORM_EPS, {}, "row-scale", "every row scaled"),
    (QWEN, Q.DEEPSTACK_DROP, {}, "zeros", "B is all zeros"),
    (QWEN, Q.MROPE_NO_DELTA, {"prompt": "<image> describe", "decode": 2}, "int-offset", "B equals A + 45"),
])
def test_a_fault_that_truly_is_a_scale_or_offset_is_called_one(model, fault, extra, name, text):
    _, diag, _ = _diagnosis(check(CaseSpec(model, dtype="float32", fault=fault, **extra)))
    assert [f["name"] for f in diag] == [name] and text in diag[0]["text"]


# ----------------------------------------------------------------------------- language side

CELLS = (2, 3)
PROMPT = "A picture: <image> What does it show?"  # the span starts at 12, 10 rows long


@pytest.fixture(scope="module")
def language(module_tmp):
    from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint

    return tiny_language_checkpoint(), torch.randn(CELLS[0] * CELLS[1], 64, generator=torch.Generator().manual_seed(7))


def _language_dump(side, checkpoint, rows, path, **kw):
    from tensordiff.pipeline.adapter import RunRequest
    from tensordiff.format.capture import Recorder

    if side == "oracle":
        from oracle.deepseek_v41_flash.model import run
    else:
        from engine.deepseek_v41_flash.language_run import run
    req = RunRequest(weights="synthetic:tiny-language", weights_dir=checkpoint, prompt=PROMPT,
                     options={"image_rows": rows, "cells": CELLS, "language_numerics": "semantic"}, **kw)
    with Recorder(path, model=DEEPSEEK, producer={"name": side, "side": side}) as rec:
        run(req, rec)
    return path


def test_the_span_overlaid_at_one_offset_in_every_chunk_is_a_row_shift(language, tmp_path):
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.judge.contract import Contract
    import tensordiff.models.deepseek_v41_flash.contract as C

    contract = Contract(DEEPSEEK, (), C.RULES, resolver=C.make_resolver(()), boundary_of=C.boundary_of)
    ckpt, rows = language
    a = _language_dump("oracle", ckpt, rows, tmp_path / "oracle")
    # chunks of 16: the second chunk gets the span's first rows at its own offset 12..15
    b = _language_dump("engine", ckpt, rows, tmp_path / "engine", chunk=16, fault=D.OVERLAY_CHUNK_SHIFT)
    r = compare_dumps(a, b, contract=contract)
    assert r.earliest == ["embeddings"]
    (f,) = r.boundary("embeddings").diagnosis
    assert f["name"] == "row-range-shift" and f["explained"] >= 0.95, f
    # rows 28-31 are A's 12-15 (row 27 may join them: the same text token at 11 and 27)
    assert "–31 (from position 2" in f["text"] and "–15 (shifted by -16)" in f["text"]
    assert "rows between 16 (position 16) and 21 (position 21) hold one repeated vector" in f["text"]


def test_the_one_line_summary_names_the_finding():
    case = check(CaseSpec(QWEN, dtype="float32", fault=Q.MERGE_ORDER_RASTER))
    assert "; diagnosis: `patches` merge-vs-raster (100%)" in case.summary_line()


# ------------------------------------------- the language sides' faults, through `check` (fp32, tiny)

LANGUAGE_PROMPT = "Here is a photo: <image> What does it show?"
TWO_IMAGES = "First <image> then <image> end."


@pytest.fixture(scope="module")
def photos(module_tmp):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
    from deepseek_images import _smooth, image_path
    from qwen3vl_images import make_images

    d = module_tmp("language-photos")
    tiny = d / "small.png"
    Image.fromarray(_smooth(40, 24, 12)).save(tiny)
    return {"qwen": make_images(d / "qwen")["chelsea"], "chelsea": image_path("chelsea", d), "tiny": tiny}


def _qwen_language(photos, fault=None, decode=1):
    return check(CaseSpec(QWEN, dtype="float32", image=photos["qwen"], prompt=LANGUAGE_PROMPT, chunk=7, decode=decode, fault=fault))


def _deepseek_two_images(photos, fault=None):
    clean = fault is None  # the clean run with chunks cutting the spans and a decode step
    return check(CaseSpec(DEEPSEEK, dtype="float32", image=photos["chelsea"], more_images=(photos["tiny"],), prompt=TWO_IMAGES,
                          extra=("language_numerics=semantic",), chunk=16 if clean else None,
                          decode=1 if clean else 0, fault=fault))


def test_mrope_sections_chunked_are_named_at_text_rope(photos):
    root, diag, shown = _diagnosis(_qwen_language(photos, Q.MROPE_CHUNKED))
    assert root == "text_rope" and [f["name"] for f in diag] == ["mrope-sections"], diag
    assert diag[0]["tensor"] == "text_rope.cos / text_rope.sin" and diag[0]["explained"] >= 0.99
    assert "chunked (t 0–5, h 6–8, w 9–11 of 12 frequencies) where A's are interleaved" in diag[0]["text"]
    assert f"diagnosis: {diag[0]['line']}" in shown


def test_the_image_rows_taken_one_late_in_a_chunk_are_a_row_shift(photos):
    root, diag, _ = _diagnosis(_qwen_language(photos, Q.IMAGE_CHUNK_SHIFT))
    assert root == "embeddings" and [f["name"] for f in diag] == ["row-range-shift"], diag
    # chunks of 7: the chunk starting at row 21 (inside the image range) reads each feature one row on
    assert diag[0]["text"].startswith("B's rows 21–") and "(shifted by +1)" in diag[0]["text"]
    assert diag[0]["explained"] >= 0.99


def test_a_later_image_span_at_its_unexpanded_position_is_a_row_range_move(photos):
    root, diag, _ = _diagnosis(_deepseek_two_images(photos, D.IMAGE_SPAN_UNEXPANDED))
    assert root == "embeddings" and [f["name"] for f in diag] == ["row-range-shift"], diag
    # the second span's rows land at its tag's unexpanded place; where it belongs, the placeholder stays
    assert "B's rows 14–" in diag[0]["text"] and "(shifted by +188)" in diag[0]["text"]
    assert "a placeholder never overwritten" in diag[0]["text"] and diag[0]["explained"] >= 0.99


@pytest.mark.parametrize("fault", [Q.DEEPSTACK_EVERY_ROW, Q.DEEPSTACK_LAYER_LATE, Q.QK_NORM_AFTER_ROPE,
                                   Q.DECODE_NO_DELTA])
def test_a_language_fault_that_is_no_layout_gets_no_simple_explanation(photos, fault):
    _, diag, shown = _diagnosis(_qwen_language(photos, fault))
    assert diag == [] and "diagnosis: no simple explanation" in shown


def test_a_head_without_the_final_norm_is_a_per_row_scale(photos):
    """Without the final RMSNorm each row is off by its own 1/rms (the norm's weight makes it not
    quite exact): a per-row scale, which is what the fault is."""
    root, diag, _ = _diagnosis(_qwen_language(photos, Q.LOGITS_NO_FINAL_NORM))
    assert root == "logits" and [f["name"] for f in diag] == ["row-scale"], diag
    assert "every row scaled" in diag[0]["text"]


def test_the_clean_language_runs_get_no_diagnosis(photos):
    for r in (_qwen_language(photos, decode=2).report, _deepseek_two_images(photos).report):
        assert r.verdict == "match", r.earliest
        assert r.as_json()["diagnosis"] == {} and "diagnosis:" not in render_text(r)
