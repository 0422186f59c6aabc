"""A swapped pair of tensors (cos <-> sin)."""
from __future__ import annotations

import numpy as np
from conftest import rand


def test_cos_and_sin_swapped(compare):
    ang = rand(80, 16)
    a = {"x.cos": np.cos(ang), "x.sin": np.sin(ang)}
    b = {"x.cos": np.sin(ang), "x.sin": np.cos(ang)}
    (f,) = compare(a, b).boundary("x").diagnosis
    assert f["name"] == "pair-swapped" and f["tensor"] == "x.cos / x.sin" and f["explained"] == 1.0


def test_a_pair_changed_otherwise_is_not_called_swapped(compare):
    ang = rand(80, 16)
    a = {"x.cos": np.cos(ang), "x.sin": np.sin(ang)}
    b = {"x.cos": np.cos(ang * 1.3), "x.sin": np.sin(ang * 1.3)}
    assert "pair-swapped" not in [f["name"] for f in compare(a, b).boundary("x").diagnosis]

