"""A tensor stored with its two dimensions swapped: incomparable to the judge, named here."""
from __future__ import annotations

import numpy as np
from conftest import rand


def test_a_tensor_stored_transposed(compare):
    a = rand(40, 12)
    r = compare({"x": a}, {"x": np.ascontiguousarray(a.T)})
    assert r.boundary("x").tensors[0].status == "incomparable"
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "transposed" and "B [12, 40] holds A [40, 12]" in f["text"] and f["explained"] == 1.0


def test_another_tensor_of_the_transposed_shape_is_not_called_transposed(compare):
    assert compare({"x": rand(40, 12)}, {"x": rand(12, 40, seed=4)}).boundary("x").diagnosis == []
