"""Scale, sign and offset: each from its planted change; a nonlinear change gets none."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import names, rand


@pytest.mark.parametrize("change,want", [
    (lambda a: 1.5 * a, "scale"),
    (lambda a: -a, "sign-flip"),
    (lambda a: a + 0.25, "offset"),
    (lambda a: a * np.linspace(0.5, 1.5, a.shape[1], dtype=np.float32), "channel-scale"),
    (lambda a: a + np.linspace(-1, 1, a.shape[1], dtype=np.float32), "channel-offset"),
])
def test_each_from_its_planted_change(compare, change, want):
    a = rand(300, 24)
    (f,) = compare({"x": a}, {"x": change(a)}).boundary("x").diagnosis
    assert f["name"] == want and f["explained"] > 0.999


def test_an_output_never_written_is_called_zeros(compare):
    a = rand(30, 8)
    (f,) = compare({"x": a}, {"x": np.zeros_like(a)}).boundary("x").diagnosis
    assert f["name"] == "zeros" and f["explained"] == 1.0 and "scaled by" not in f["text"]


def test_one_grid_row_scaled_is_named_by_its_rows(compare):
    h, w = 10, 12
    a = rand(h * w, 16)
    b = a.copy()
    b[(h - 1) * w:] *= 1 + 2 ** -6  # the tail-loop bug: the last grid row scaled
    (f,) = compare({"x": a}, {"x": b}, layout="grid", run={"inputs": {"grid": [h, w]}}).boundary("x").diagnosis
    assert f["name"] == "row-scale" and "rows 108–119 (patch (y=9, x=0) to patch (y=9, x=11))" in f["text"]
    assert "by 1.0156" in f["text"] and f["explained"] > 0.999


def test_a_per_row_normalisation_constant(compare):
    a = rand(200, 64) * np.geomspace(0.05, 5, 200, dtype=np.float32)[:, None]  # rows of many sizes
    ms = (a ** 2).mean(1, keepdims=True)
    b = a * np.sqrt(ms / (ms + 0.5))  # a norm with another epsilon: a scale per row
    (f,) = compare({"x": a}, {"x": b}).boundary("x").diagnosis
    assert f["name"] == "row-scale" and "every row" in f["text"]


def test_a_nonlinear_change_gets_no_scale(compare):
    a = rand(300, 24)
    b = np.tanh(a)  # an activation changed: no scale, sign or offset explains it
    assert names(compare({"x": a}, {"x": b})) == []
