"""The HTML report: the picture rebuilt from patches, heat placed by layout, escaping, and a real
browser rendering it (headless Chromium)."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.format.dump import open_dump
from tensordiff.reports.html import (
    canvas_from_patches, error_grid, heat_rgba, heat_views, render_html, write_html,
)
from tensordiff.reports.junit import case_of
from tensordiff.judge.result import BoundaryResult, Report, TensorResult

DUMPS = Path(__file__).resolve().parents[2] / "dumps"
CHROMIUM = "/usr/bin/chromium"


def _picture(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _patchify(img, p, t=1, merge=False):
    """[H, W, 3] uint8 -> [N, 3*t*p*p] in [-1, 1], raster or 2x2-merge row order."""
    x = img.astype(np.float32) / 255 * 2 - 1
    gh, gw = img.shape[0] // p, img.shape[1] // p
    x = x.transpose(2, 0, 1).reshape(3, gh, p, gw, p).transpose(1, 3, 0, 2, 4)  # [gh, gw, 3, p, p]
    x = np.repeat(x[:, :, :, None], t, axis=3)  # [gh, gw, 3, t, p, p]
    if merge:
        x = x.reshape(gh // 2, 2, gw // 2, 2, 3, t, p, p).transpose(0, 2, 1, 3, 4, 5, 6, 7)
    return x.reshape(gh * gw, 3 * t * p * p)


def test_canvas_round_trips_raster_patches():
    img = _picture(4 * 14, 6 * 14)
    c = canvas_from_patches(_patchify(img, 14), "grid", {"inputs": {"grid": [4, 6]}})
    assert c.shape == img.shape and np.abs(c.astype(int) - img).max() <= 1


def test_canvas_round_trips_merge_order_with_temporal_patches():
    img = _picture(4 * 16, 6 * 16, seed=1)  # Qwen3-VL: [N, 1536] = 3 x 2 x 16 x 16, 2x2-merge order
    rows = _patchify(img, 16, t=2, merge=True)
    assert rows.shape == (24, 1536)
    c = canvas_from_patches(rows, "merge", {"inputs": {"grid": [4, 6]}})
    assert np.abs(c.astype(int) - img).max() <= 1
    assert canvas_from_patches(rows, "grid", {"inputs": {"grid": [4, 6]}}) is not None  # wrong order, still drawn
    assert canvas_from_patches(rows[:, :1000], "merge", {"inputs": {"grid": [4, 6]}}) is None  # not pixels


def test_error_grid_places_rows_by_layout():
    run = {"inputs": {"grid": [4, 6], "cells": [2, 2]}}
    err = np.zeros(24)
    err[7] = 5.0  # raster row 7 = patch (1, 1)
    g, shape = error_grid(err, "grid", run)
    assert shape == (4, 6) and g[1, 1] == 5.0 and np.nansum(g) == 5.0
    err = np.zeros(24)
    err[4 + 3] = 2.0  # merge order: block 1 (block-row 0, block-col 1), intra 3 -> patch (1, 3)
    g, _ = error_grid(err, "merge", run)
    assert g[1, 3] == 2.0 and np.nansum(g) == 2.0
    cells = np.array([0.0, 1.0, 0.0, 0.0])  # cell (0, 1) covers patch columns 3..5 of rows 0..2
    g, _ = error_grid(cells, "cells", run)
    assert (g[:3, 3:6] == 1.0).all() and g[:, :3].sum() == 0 and g[3:, 3:].sum() == 0


def test_heat_colours_are_clear_below_and_red_above_tolerance():
    rgba = heat_rgba(np.array([[1e-9, 1e-4, 1.0, np.nan]]), scale=1e-4)
    assert rgba[0, 0, 3] == 0 and rgba[0, 3, 3] == 0  # tiny error, no data: clear
    assert rgba[0, 1, 3] > 0 and rgba[0, 1, 0] > 200 and rgba[0, 1, 1] > 200  # at tolerance: yellow
    assert rgba[0, 2, 0] > 200 and rgba[0, 2, 1] < 40  # 10^4 x tolerance: red


def test_sample_report_has_a_heatmap_per_image_tensor_over_the_picture():
    r = compare_dumps(DUMPS / "sample-oracle", DUMPS / "sample-engine")
    views = heat_views(r, open_dump(DUMPS / "sample-oracle"))
    assert [(v.boundary, v.tensor) for v in views] == [
        ("patches", "patches"), ("rope", "rope.cos"), ("rope", "rope.sin"), ("block0", "block0"),
        ("final_norm", "final_norm"), ("aligner", "aligner")]
    assert all(v.grid == (6, 9) for v in views)
    assert views[0].max_err == 0 and views[1].max_err > 1
    pic = Image.open(io.BytesIO(views[1].jpeg))
    assert pic.size[0] >= 320  # a tiny grid is scaled up to be seen
    assert "layout inferred" in views[1].note  # no contract for the sample model


def test_heat_shows_where_the_error_is():
    # error only on the right column of a 6x9 grid: the right edge of the picture turns red
    run = {"inputs": {"grid": [6, 9]}}
    rows = np.zeros(54)
    rows[8::9] = 1.0
    t = TensorResult("x", "b", "diverged", row_error=rows.tolist(), tolerance={"atol": 1e-4},
                     shape={"a": [54, 4]}, dtype={"a": "float32"})
    r = Report("a", "b", "m", [BoundaryResult("b", "diverged", tensors=[t], layout="grid")],
               runs={"a": run, "b": run})
    (v,) = heat_views(r)
    px = np.asarray(Image.open(io.BytesIO(v.jpeg)).convert("RGB")).astype(int)
    w = px.shape[1]
    right, left = px[:, int(w * 0.95):], px[:, : int(w * 0.8)]
    assert right[..., 0].mean() > 150 and right[..., 0].mean() - right[..., 1].mean() > 80
    assert abs(left[..., 0].mean() - left[..., 1].mean()) < 20  # the rest stays a neutral board
    assert v.worst[1] == 8



def test_heat_is_scaled_by_the_atol_the_elements_were_judged_by():
    # a magnitude-aware atol (`atol_scale`): the colour scale is atol x the measured RMS of A
    run = {"inputs": {"grid": [6, 9]}}
    tol = {"atol": 1e-4, "rtol": 1e-3, "atol_scale": "rms", "scale": 40.0}
    t = TensorResult("x", "b", "match", row_error=[1e-3] * 54, tolerance=tol, shape={"a": [54, 4]},
                     dtype={"a": "float32"})
    r = Report("a", "b", "m", [BoundaryResult("b", "match", tensors=[t], layout="grid")], runs={"a": run, "b": run})
    (v,) = heat_views(r)
    assert v.scale == pytest.approx(4e-3)

EVIL = '<script>alert("x")</script>'


def test_planted_script_is_escaped_everywhere(tmp_path):
    for side in ("oracle", "engine"):
        d = tmp_path / side
        shutil.copytree(DUMPS / f"sample-{side}", d)
        m = json.loads((d / "manifest.json").read_text())
        m["model"] = EVIL
        m["producer"]["name"] = "<img src=x onerror=alert(1)>"
        m["run"]["device"] = EVIL + side  # differs: becomes a note
        (d / "manifest.json").write_text(json.dumps(m))
    r = compare_dumps(tmp_path / "oracle", tmp_path / "engine")
    # names cannot carry markup through the reader; plant one in a result as another producer could
    r.boundaries[1].tensors[0].name = EVIL
    r.boundaries[1].tensors[0].reason = EVIL
    r.boundaries[1].name = EVIL
    case = case_of(r, label=EVIL)
    case.views = heat_views(r, open_dump(tmp_path / "oracle"))
    page = render_html([case], title=EVIL)
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;script&gt;" in page
    assert "Content-Security-Policy" in page  # and no script could run if one slipped through


def _chromium_or_skip():
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.environ.get("TENSORDIFF_REQUIRE_BROWSER") == "1":
        pytest.fail(f"TENSORDIFF_REQUIRE_BROWSER=1 but {CHROMIUM} is missing (apt-get install -y chromium)")
    pytest.skip(f"{CHROMIUM} not installed (set TENSORDIFF_REQUIRE_BROWSER=1 to make this a failure)")


def test_headless_chromium_renders_the_report(tmp_path):
    exe = _chromium_or_skip()
    r = compare_dumps(DUMPS / "sample-oracle", DUMPS / "sample-engine")
    case = case_of(r, "sample")
    case.views = heat_views(r, open_dump(DUMPS / "sample-oracle"))
    page = tmp_path / "report.html"
    write_html([case], page)
    shot = tmp_path / "shot.png"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1800", f"--screenshot={shot}",
           page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape[:2] == (1800, 1200)
    # not a blank page: many colours, the red headline and the heatmaps' reds are there
    assert len(np.unique(img.reshape(-1, 3) // 16, axis=0)) > 50
    reds = (img[..., 0] > 180) & (img[..., 1] < 80) & (img[..., 2] < 80)
    assert reds.sum() > 5000


def test_missing_browser_fails_when_required_and_skips_otherwise(monkeypatch):
    import sys

    mod = sys.modules[__name__]
    monkeypatch.setattr(mod, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("TENSORDIFF_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="TENSORDIFF_REQUIRE_BROWSER=1"):
        _chromium_or_skip()
    monkeypatch.delenv("TENSORDIFF_REQUIRE_BROWSER")
    with pytest.raises(pytest.skip.Exception):
        _chromium_or_skip()
