"""Column hypotheses: each named permutation found from its planted layout, and any other
permutation of a short row named as one."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import names, rand


def _one(report):
    (f,) = report.boundary("x").diagnosis
    return f


def test_interleaved_vs_blocked_rope_halves(compare):
    a = rand(100, 32)
    b = np.empty_like(a)
    b[:, 0::2], b[:, 1::2] = a[:, :16], a[:, 16:]  # row, col, row, col ... instead of 16 rows then 16 cols
    f = _one(compare({"x": a}, {"x": b}))
    assert f["name"] == "interleaved-halves" and f["explained"] == 1.0
    f = _one(compare({"x": b}, {"x": a}))
    assert f["name"] == "blocked-halves"


def test_two_halves_swapped_inside_each_half_of_the_row(compare):
    a = rand(100, 32)
    b = a.reshape(100, 2, 2, 8)[:, :, ::-1].reshape(100, 32)  # (h, w) angles swapped in cat(rot, rot)
    f = _one(compare({"x": a}, {"x": b}))
    assert f["name"] == "swapped-halves" and "16-column half" in f["text"]


@pytest.mark.parametrize("shape,order,want", [
    ((3, 4, 4), (1, 2, 0), "(y, x, c) where A's are (c, y, x)"),
    ((3, 2, 4, 4), (1, 0, 2, 3), "(t, c, y, x) where A's are (c, t, y, x)"),
    ((9, 8), (1, 0), "(channel, position) where A's are (position, channel)"),
])
def test_patch_flattening_and_unfold_orders(compare, shape, order, want):
    n = int(np.prod(shape))
    a = rand(64, n)
    b = a.reshape((64,) + shape).transpose((0,) + tuple(k + 1 for k in order)).reshape(64, n)
    f = _one(compare({"x": a}, {"x": b}))
    assert f["name"] == "flatten-order" and want in f["text"] and f["explained"] == 1.0


def test_an_rb_channel_swap(compare):
    a = rand(64, 48)
    b = a.reshape(64, 3, 16)[:, ::-1].reshape(64, 48)
    assert names(compare({"x": a}, {"x": b})) == ["rb-swap"]


def test_any_other_permutation_of_a_short_row_is_named_as_one(compare):
    a = rand(128, 20)
    perm = np.random.default_rng(3).permutation(20)
    f = _one(compare({"x": a}, {"x": a[:, perm]}))
    assert f["name"] == "column-permutation" and f["explained"] == 1.0


def test_a_partly_permuted_row_under_noise_is_not_claimed_as_a_layout(compare):
    a = rand(128, 32)
    b = a + 0.3 * rand(128, 32, seed=5)
    b[:, [0, 1]] = b[:, [1, 0]]
    assert not [n for n in names(compare({"x": a}, {"x": b})) if n.endswith(("halves", "order", "permutation"))]


def test_tensors_of_a_boundary_explained_alike_share_one_line(compare):
    a, c = rand(100, 32), rand(100, 32, seed=8)
    inter = lambda x: np.stack([x[:, :16], x[:, 16:]], 2).reshape(100, 32)  # noqa: E731
    (f,) = compare({"x.cos": a, "x.sin": c}, {"x.cos": inter(a), "x.sin": inter(c)}).boundary("x").diagnosis
    assert f["tensor"] == "x.cos / x.sin" and f["name"] == "interleaved-halves"
