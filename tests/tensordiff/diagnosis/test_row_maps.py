"""Row hypotheses: every one found from a planted move, none from noise."""
from __future__ import annotations

import numpy as np
from conftest import names, rand

from tensordiff.judge.diagnosis.row_maps import merge_to_raster
from tensordiff.reports.text import render_text


def test_a_global_shift_by_k(compare):
    a = rand(200, 16)
    b = np.roll(a, 3, axis=0)
    r = compare({"x": a}, {"x": b})
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "shift" and "shifted by 3 rows" in f["text"] and f["explained"] > 0.98


def test_a_shift_over_a_row_range_and_a_placeholder(compare):
    a = rand(300, 16)
    b = a.copy()
    b[100:140] = a[60:100]  # a span pasted 40 rows late
    b[140:180] = a[0]  # a placeholder never overwritten: one vector, repeated
    b[140:180] += 7.0
    r = compare({"x": a}, {"x": b}, layout="tokens")
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "row-range-shift" and "rows 100–139" in f["text"] and "shifted by -40" in f["text"]
    assert "placeholder" in f["text"] and f["explained"] == 1.0


def test_raster_order_where_merge_order_was_expected(compare):
    h, w = 8, 12
    a = rand(h * w, 24)
    m2r = merge_to_raster(h, w)
    b = a[np.argsort(m2r)]  # B raster: B[raster] = A[merge position of that patch]
    r = compare({"x": a}, {"x": b}, layout="merge", run={"inputs": {"grid": [h, w]}})
    assert names(r) == ["merge-vs-raster"] and r.boundary("x").diagnosis[0]["explained"] == 1.0
    r = compare({"x": a}, {"x": a[m2r]}, layout="grid", run={"inputs": {"grid": [h, w]}})
    assert names(r) == ["raster-vs-merge"]


def test_a_transposed_grid(compare):
    h, w = 6, 10
    a = rand(h * w, 8)
    b = a.reshape(h, w, 8).transpose(1, 0, 2).reshape(h * w, 8)
    r = compare({"x": a}, {"x": b}, layout="grid", run={"inputs": {"grid": [h, w]}})
    assert names(r) == ["transposed-grid"] and r.boundary("x").diagnosis[0]["explained"] == 1.0


def test_a_pad_misplaced_in_a_grid_of_width_w_prime(compare):
    h, w, w2 = 9, 10, 12
    a = rand(h * w, 8)
    flat = np.concatenate([a, np.zeros((h * w2 - h * w, 8), np.float32)])
    y, x = np.divmod(np.arange(h * w), w)
    b = flat[y * w2 + x]  # B's row y starts at flat row y*w2: the pad went to the flat end
    b[y * w2 + x >= h * w] = 0
    r = compare({"x": a}, {"x": b}, layout="grid", run={"inputs": {"grid": [h, w]}})
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "pad-misplaced" and "row width of 12 instead of 10" in f["text"] and f["explained"] > 0.99


def test_noise_and_an_unrelated_change_get_no_row_diagnosis(compare):
    a = rand(256, 32)
    noisy = a + 0.05 * rand(256, 32, seed=1)
    r = compare({"x": a}, {"x": noisy}, layout="grid", run={"inputs": {"grid": [16, 16]}})
    assert r.boundary("x").status == "diverged" and r.boundary("x").diagnosis == []
    assert "no simple explanation" in render_text(r)


def test_a_clean_pair_gets_no_diagnosis(compare):
    a = rand(64, 8)
    r = compare({"x": a}, {"x": a.copy()}, layout="grid", run={"inputs": {"grid": [8, 8]}})
    assert r.verdict == "match" and r.boundary("x").diagnosis is None and "diagnosis:" not in render_text(r)
    assert r.as_json()["diagnosis"] == {}


def test_a_grid_read_with_height_and_width_swapped(compare):
    h, w = 6, 10
    a = rand(h * w, 8)
    b = a.reshape(w, h, 8).transpose(1, 0, 2).reshape(h * w, 8)  # the other way round
    r = compare({"x": a}, {"x": b}, layout="grid", run={"inputs": {"grid": [h, w]}})
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "transposed-grid" and "read as 10x6" in f["text"] and f["explained"] == 1.0


def test_a_grid_padded_at_each_row_end_and_read_back_flat(compare):
    h, w, w2 = 8, 10, 11
    a = rand(h * w, 8)
    y, x = np.divmod(np.arange(h * w), w2)  # B's flat row i is A's (y, x) on an 11-wide padded grid
    b = np.where((x < w)[:, None] & ((y * w + x) < h * w)[:, None], a[np.clip(y * w + x, 0, h * w - 1)], 0)
    r = compare({"x": a}, {"x": b.astype(np.float32)}, layout="grid", run={"inputs": {"grid": [h, w]}})
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "pad-misplaced" and "padded to width 11" in f["text"] and f["explained"] > 0.99


def _placeholder_by_unique(rows, match, xb):
    """The placeholder as np.unique(axis=0) finds it (rows compared as records, sorted): the
    reference the byte-grouped search in row_maps must agree with."""
    from tensordiff.judge.diagnosis.row_maps import UNKNOWN

    lost = np.flatnonzero(match == UNKNOWN)
    if lost.size < 3:
        return None, lost[:0]
    vals, inv, counts = np.unique(xb[lost], axis=0, return_inverse=True, return_counts=True)
    k = int(np.argmax(counts))
    if counts[k] < 3:
        return None, lost[:0]
    return vals[k], rows[lost[inv.reshape(-1) == k]]


def test_the_placeholder_search_finds_what_np_unique_finds():
    from tensordiff.judge.diagnosis.row_maps import UNKNOWN, _placeholder

    rng = np.random.default_rng(5)
    for trial in range(300):
        n, width = int(rng.integers(0, 14)), int(rng.integers(1, 5))
        vecs = rng.integers(-2, 3, (3, width)).astype(np.float64)  # few values: repeats and ties
        xb = vecs[rng.integers(0, 3, n)] if n else np.zeros((0, width))
        if n and trial % 3 == 0:
            i = rng.integers(0, n)
            xb[i] = np.where(xb[i] == 0, -0.0, xb[i])  # -0.0 where a 0.0 was: still the same vector
        if n and trial % 5 == 0:
            xb[(xb == vecs[0]).all(1), 0] = np.nan  # rows holding a NaN: equal to no other, the same bytes or not
        xb = xb + rng.integers(0, 2, (n, 1)) * rng.normal(0, 1, (n, width)) * (trial % 2)  # some unique rows
        rows = np.sort(rng.choice(1000, n, replace=False))
        match = np.where(rng.random(n) < 0.8, UNKNOWN, 1)
        want, got = _placeholder_by_unique(rows, match, xb), _placeholder(rows, match, xb)
        assert (want[0] is None) == (got[0] is None), trial
        if want[0] is not None:
            assert np.array_equal(want[0], got[0]), trial
        assert np.array_equal(want[1], got[1]), trial
