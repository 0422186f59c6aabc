"""M-RoPE section layout: B's frequencies read another position axis than A's (chunked vs
interleaved sections), found from the boundary's input position ids; a clean pair, another kind of
change, or no position ids give no such finding."""
from __future__ import annotations

import numpy as np
import pytest

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Boundary, Contract
from tensordiff.judge.diagnosis.mrope_sections import describe

from conftest import MODEL, write

SECTIONS = (6, 3, 3)  # 12 frequencies: head_dim 24


def positions() -> np.ndarray:
    """Text rows 0-4 on the diagonal, a 3x4 image at t = 5, then text from 9 on."""
    cols = [(p, p, p) for p in range(5)]
    cols += [(5, 5 + y, 5 + x) for y in range(3) for x in range(4)]
    cols += [(p, p, p) for p in range(9, 15)]
    return np.array(cols, dtype=np.int64).T


def interleaved(sections=SECTIONS) -> np.ndarray:
    axis = np.zeros(sum(sections), dtype=np.int64)
    axis[1:3 * sections[1]:3], axis[2:3 * sections[2]:3] = 1, 2
    return axis


def chunked(sections=SECTIONS) -> np.ndarray:
    return np.repeat(np.arange(3), sections)


def rope(axis: np.ndarray, pos: np.ndarray, theta=1e4) -> dict:
    h = axis.size
    f = theta ** (-np.arange(h) / h)
    ang = np.concatenate([pos[axis].T * f] * 2, axis=1)
    return {"x.cos": np.cos(ang).astype(np.float32), "x.sin": np.sin(ang).astype(np.float32)}


def compare(tmp_path, a: dict, b: dict, pos=True):
    inputs = ("positions",) if pos else ()
    c = Contract(MODEL, (Boundary("positions"), Boundary("x", inputs)))
    p = {"positions.ids": positions()}
    da, db = write(tmp_path / "a", {**p, **a}, {}), write(tmp_path / "b", {**p, **b}, {})
    return compare_dumps(da, db, contract=c)


def test_chunked_sections_against_interleaved_are_named(tmp_path):
    pos = positions()
    r = compare(tmp_path, rope(interleaved(), pos), rope(chunked(), pos))
    assert r.earliest == ["x"]
    (f,) = r.boundary("x").diagnosis
    assert f["name"] == "mrope-sections" and f["tensor"] == "x.cos / x.sin" and f["explained"] >= 0.999, f
    assert "chunked (t 0–5, h 6–8, w 9–11 of 12 frequencies)" in f["text"]
    assert "interleaved (t, h, w, t, h, w, …; sections [6, 3, 3])" in f["text"]
    assert "chunked vs interleaved" in f["text"]


def test_the_other_way_round_too(tmp_path):
    pos = positions()
    (f,) = compare(tmp_path, rope(chunked(), pos), rope(interleaved(), pos)).boundary("x").diagnosis
    assert f["name"] == "mrope-sections" and f["text"].startswith("B's M-RoPE frequencies take their position "
                                                                  "axis interleaved")


def test_same_axes_with_other_positions_are_not_a_section_layout(tmp_path):
    pos = positions()
    later = pos.copy()
    later[:, 17:] += 3  # a position delta, not an axis choice
    r = compare(tmp_path, rope(interleaved(), pos), rope(interleaved(), later))
    assert "mrope-sections" not in {f["name"] for f in r.boundary("x").diagnosis or []}


def test_a_clean_pair_has_no_diagnosis(tmp_path):
    pos = positions()
    r = compare(tmp_path, rope(interleaved(), pos), rope(interleaved(), pos))
    assert r.verdict == "match" and not r.boundary("x").diagnosis


def test_without_position_ids_as_input_the_hypothesis_is_not_tried(tmp_path):
    pos = positions()
    r = compare(tmp_path, rope(interleaved(), pos), rope(chunked(), pos), pos=False)
    assert r.earliest == ["x"]
    assert "mrope-sections" not in {f["name"] for f in r.boundary("x").diagnosis or []}


@pytest.mark.parametrize("axis,text", [
    (interleaved((24, 20, 20)), "interleaved (t, h, w, t, h, w, …; sections [24, 20, 20])"),
    (chunked((16, 24, 24)), "chunked (t 0–15, h 16–39, w 40–63 of 64 frequencies)"),
    (np.array([0, 2, 1, 0]), "axes twht"),
])
def test_describe(axis, text):
    assert describe(axis) == text
