"""Sizes: plan fields named from the contract's meaning, a one-pixel resize called one."""
from __future__ import annotations

import numpy as np

from tensordiff.judge.diagnosis.sizes import field_names
from tensordiff.reports.text import render_text

MEANING = "plan.size [src_w, src_h, content_w, content_h], plan.grid [gh, gw]"


def _plan(*size, grid=(5, 7)):
    return {"plan.size": np.array(size, dtype=np.int64), "plan.grid": np.array(grid, dtype=np.int64)}


def test_field_names_come_from_the_meaning():
    assert field_names(MEANING) == {"plan.size": ["src_w", "src_h", "content_w", "content_h"], "plan.grid": ["gh", "gw"]}


def test_a_resize_by_one_pixel(compare):
    x = {"x": np.zeros((4, 4), np.float32)}
    r = compare(x, x, meaning=MEANING, plan=(_plan(100, 70, 100, 69), _plan(100, 70, 100, 70)))
    (f,) = r.boundary("plan").diagnosis
    assert f["name"] == "resize-by-one" and "content_h 70 vs A's 69 (+1)" in f["text"] and "ceil" in f["text"]
    assert "diagnosis: plan.size: B resized by one pixel" in render_text(r)


def test_a_larger_size_change_is_described_not_called_a_rounding(compare):
    x = {"x": np.zeros((4, 4), np.float32)}
    r = compare(x, x, meaning=MEANING, plan=(_plan(100, 70, 96, 64), _plan(100, 70, 112, 80, grid=(5, 8))))
    (f,) = r.boundary("plan").diagnosis
    assert f["name"] == "size-differs" and "content_w 112 vs A's 96 (+16)" in f["text"] and "gw 8 vs A's 7" in f["text"]
