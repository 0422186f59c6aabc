"""Integer tensors outside the plan: one constant offset named, anything else not."""
from __future__ import annotations

import numpy as np


def test_positions_off_by_one_constant(compare):
    pos = np.arange(60, dtype=np.int64).reshape(3, 20)
    late = pos.copy()
    late[:, 12:] += 45  # decode positions continue from the length, not from the delta
    r = compare({"x.ids": pos, "x.delta": np.array([-45])}, {"x.ids": late, "x.delta": np.array([0])})
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "int-offset" and f["explained"] == 1.0
    assert "B equals A + 45 wherever they differ (24 of `x.ids`, 1 of `x.delta`)" in f["text"]


def test_integers_changed_otherwise_get_no_offset(compare):
    pos = np.arange(60, dtype=np.int64).reshape(3, 20)
    other = pos.copy()
    other[0, 3], other[1, 4] = 7, 100
    assert compare({"x": pos}, {"x": other}).boundary("x").diagnosis == []
