"""One self-contained HTML page a person opens from CI: the boundary table per case and, for
image boundaries, a heatmap of the error over the patch grid laid over the input image as the
model saw it (resized and padded), so a shifted right edge, a band or a corner is seen at once.

    views = heat_views(report, open_dump(oracle_dir))   # while the dumps exist
    write_html([case], "report.html")                   # case.views = views

The picture is rebuilt from the reference dump's `patches` tensor (rows of (c, [t,] y, x) pixels,
values in [-1, 1]), so no model code and no image file are needed; the error per patch is the
comparator's max |Δ| per leading row (`TensorResult.row_error`), placed by `layout.row_position`.
Every string that can come from a manifest is escaped; pictures are inline JPEG data URIs.
"""
from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from tensordiff.format.storage import write_text_atomic
from tensordiff.judge.tolerance import Tolerance
from tensordiff.judge.layout import row_position
from tensordiff.reports.text import diagnosis_lines, dtype_text, headline, headline as head
from tensordiff.judge.result import FAILING, Report
from tensordiff.version import VERSION

IMAGE_LAYOUTS = ("grid", "merge", "merged", "cells")
MAX_SIDE = 480  # px of the longest side of a heatmap picture: readable, and the page stays small
MIN_SIDE = 320
# The largest patch grid a heatmap is drawn on: 16M patches (a 65,536-pixel square at patch 16),
# far beyond any model's budget; a larger one in a manifest or contract gets no heatmap.
MAX_GRID_SIDE = 1 << 16
MAX_GRID_CELLS = 1 << 24


def esc(s) -> str:
    return html.escape(str(s), quote=True)


@dataclass
class HeatView:
    boundary: str
    tensor: str
    layout: str  # as used (may be inferred for a contract-less dump)
    jpeg: bytes  # the composite picture
    grid: tuple[int, int]  # patch grid the heat was drawn on
    max_err: float
    scale: float  # error that maps to the top of the colour scale's "at tolerance" mark
    worst: tuple[int, int] | None  # (y, x) patch of the worst row
    note: str = ""


# ----------------------------------------------------------------------------- geometry

def _grid(run: dict, key: str) -> tuple[int, int] | None:
    """run.inputs.grid / .cells as (h, w); None when absent, malformed or larger than any picture
    (a manifest or contract is untrusted, and the heatmap allocates the grid)."""
    g = (run.get("inputs") or {}).get(key) if isinstance(run, dict) else None
    if (isinstance(g, (list, tuple)) and len(g) == 2 and all(type(v) is int and 0 < v <= MAX_GRID_SIDE for v in g)
            and g[0] * g[1] <= MAX_GRID_CELLS):
        return int(g[0]), int(g[1])
    return None


def image_layout(layout: str, rows: int, run: dict) -> tuple[str, str] | None:
    """The layout to draw with, and a note when it was inferred (a dump without a contract)."""
    if layout in IMAGE_LAYOUTS:
        return layout, ""
    if layout != "plain":
        return None
    g, c = _grid(run, "grid"), _grid(run, "cells")
    if g and rows == g[0] * g[1]:
        return "grid", "layout inferred from run.inputs.grid (no contract for this model)"
    if c and rows == c[0] * c[1]:
        return "cells", "layout inferred from run.inputs.cells (no contract for this model)"
    return None


def _positions(layout: str, rows: int, run: dict) -> np.ndarray | None:
    """[rows, 2] (y, x) on the layout's own grid, or None when the run lacks the grid."""
    pos = np.empty((rows, 2), dtype=np.int64)
    for r in range(rows):
        p = row_position(layout, r, run)
        if p is None:
            return None
        pos[r] = p
    return pos


def error_grid(row_error, layout: str, run: dict) -> tuple[np.ndarray, tuple[int, int]] | None:
    """Max |Δ| per patch on the patch grid [gh, gw] (NaN where no row lands)."""
    rows = len(row_error)
    pos = _positions(layout, rows, run)
    if pos is None:
        return None
    g = _grid(run, "grid")
    err = np.asarray(row_error, dtype=np.float64)
    if layout in ("grid", "merge"):
        if not g:
            return None
        out = np.full(g, np.nan)
        ok = (pos[:, 0] < g[0]) & (pos[:, 1] < g[1])
        np.fmax.at(out, (pos[ok, 0], pos[ok, 1]), err[ok])
        return out, g
    # token cells cover several patches each: paint each cell over the patches it covers
    cells = _grid(run, "cells") if layout == "cells" else (g[0] // 2, g[1] // 2) if g else None
    if not cells:
        return None
    ch, cw = cells
    small = np.full(cells, np.nan)
    ok = (pos[:, 0] < ch) & (pos[:, 1] < cw)
    np.fmax.at(small, (pos[ok, 0], pos[ok, 1]), err[ok])
    if not g:
        return small, cells
    fy, fx = _cell_factor(g, cells)
    big = np.repeat(np.repeat(small, fy, 0), fx, 1)[: g[0], : g[1]]
    return big, g


def _cell_factor(g: tuple[int, int], cells: tuple[int, int]) -> tuple[int, int]:
    """Patches per token cell side: the smallest r with ceil(g / r) == cells on both axes (a
    partial cell at the right/bottom edge still makes a token), else per axis."""
    for r in range(1, max(g) + 1):
        if math.ceil(g[0] / r) == cells[0] and math.ceil(g[1] / r) == cells[1]:
            return r, r
    return math.ceil(g[0] / cells[0]), math.ceil(g[1] / cells[1])


def canvas_from_patches(patches: np.ndarray, layout: str, run: dict) -> np.ndarray | None:
    """The resized, padded picture [H, W, 3] uint8 rebuilt from a [N, 3·t·p·p] patches tensor."""
    if patches.ndim != 2:
        return None
    n, cols = patches.shape
    p = t = 0
    for tt in (1, 2):
        q = cols / (3 * tt)
        pp = int(round(math.sqrt(q))) if q > 0 else 0
        if pp > 0 and 3 * tt * pp * pp == cols:
            p, t = pp, tt
            break
    g = _grid(run, "grid")
    if not p or not g or layout not in ("grid", "merge"):
        return None
    pos = _positions(layout, n, run)
    if pos is None or n != g[0] * g[1]:
        return None
    x = np.nan_to_num(patches.reshape(n, 3, t, p, p)[:, :, 0].astype(np.float32))  # [N, 3, p, p]
    lo, hi = float(x.min()), float(x.max())
    if lo >= -1.05 and hi <= 1.05:  # the usual (v/255 - 0.5) / 0.5 normalisation
        x = (x * 0.5 + 0.5) * 255.0
    else:  # some other normalisation: stretch what is there
        x = (x - lo) / max(hi - lo, 1e-12) * 255.0
    img = np.zeros((g[0], g[1], p, p, 3), dtype=np.uint8)
    img[pos[:, 0], pos[:, 1]] = np.clip(x, 0, 255).round().astype(np.uint8).transpose(0, 2, 3, 1)
    return img.transpose(0, 2, 1, 3, 4).reshape(g[0] * p, g[1] * p, 3)


# ----------------------------------------------------------------------------- colours

def heat_rgba(err: np.ndarray, scale: float) -> np.ndarray:
    """[h, w] errors -> [h, w, 4] uint8. Log scale around the tolerance: 1/100 of it is clear,
    blue to yellow up to the tolerance, orange to red beyond (red at 100× the tolerance)."""
    scale = scale if scale > 0 and math.isfinite(scale) else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log10(np.maximum(err, 0) / scale)  # -inf .. inf, 0 at the tolerance
    r = np.where(np.isnan(err), np.nan, np.where(np.isinf(err) & (err > 0), 2.0, r))
    s = np.clip((np.nan_to_num(r, nan=-9.0) + 2.0) / 4.0, 0.0, 1.0)  # 0: 1/100 tol, .5: tol, 1: 100 tol
    stops = np.array([[40, 70, 220], [60, 200, 230], [250, 230, 60], [250, 140, 30], [220, 20, 20]], float)
    pos = s * (len(stops) - 1)
    i = np.clip(pos.astype(int), 0, len(stops) - 2)
    f = (pos - i)[..., None]
    rgb = stops[i] * (1 - f) + stops[i + 1] * f
    alpha = np.where(s <= 0, 0.0, 0.35 + 0.5 * s)
    alpha = np.where(np.isnan(err), 0.0, alpha)
    out = np.concatenate([rgb, alpha[..., None] * 255], -1)
    return np.clip(out, 0, 255).round().astype(np.uint8)


def composite(canvas: np.ndarray | None, err: np.ndarray, scale: float, worst: tuple[int, int] | None) -> bytes:
    from PIL import Image, ImageDraw

    gh, gw = err.shape
    if canvas is not None:
        base = Image.fromarray(canvas, "RGB")
    else:  # no picture: a dark board the size of the grid
        cell = max(4, MAX_SIDE // max(gh, gw))
        base = Image.new("RGB", (gw * cell, gh * cell), (30, 30, 36))
    big = max(base.size)
    if big > MAX_SIDE:
        k = MAX_SIDE / big
        base = base.resize((max(1, round(base.width * k)), max(1, round(base.height * k))), Image.Resampling.BILINEAR)
    elif big < MIN_SIDE:  # a tiny test picture: whole-pixel upscaling keeps patches crisp
        k = MIN_SIDE // big + 1
        base = base.resize((base.width * k, base.height * k), Image.Resampling.NEAREST)
    # dim and desaturate the picture so the heat reads over it
    base = Image.blend(base, base.convert("L").convert("RGB"), 0.5).point(lambda v: int(v * 0.8))
    heat = Image.fromarray(heat_rgba(err, scale), "RGBA").resize(base.size, Image.Resampling.NEAREST)
    out = base.convert("RGBA")
    out.alpha_composite(heat)
    if worst is not None:
        d = ImageDraw.Draw(out)
        sx, sy = out.width / gw, out.height / gh
        y, x = worst
        d.rectangle([x * sx - 1, y * sy - 1, (x + 1) * sx, (y + 1) * sy], outline=(255, 255, 255, 255), width=2)
    buf = io.BytesIO()
    # JPEG: a photo under a heat layer is 10x smaller than PNG and encodes 50x faster
    out.convert("RGB").save(buf, "JPEG", quality=88)
    return buf.getvalue()


# ----------------------------------------------------------------------------- views

def heat_views(report: Report, dump_a=None, only_failing: bool = False) -> list[HeatView]:
    """Heatmaps for every float tensor of an image boundary. `dump_a` (the reference dump,
    opened) supplies the picture; without it the heat is drawn on a plain board."""
    run = (report.runs or {}).get("a") or (report.runs or {}).get("b") or {}
    canvas = None
    if dump_a is not None:
        canvas = _canvas(report, dump_a, run)
    views = []
    for b in report.boundaries:
        if only_failing and b.status not in FAILING + ("consequent",):
            continue
        for t in b.tensors:
            if not t.row_error:
                continue
            lay = image_layout(b.layout, len(t.row_error), run)
            if lay is None:
                continue
            eg = error_grid(t.row_error, lay[0], run)
            if eg is None:
                continue
            err, g = eg
            if t.mode == "floor":  # row_error holds each row's × floor: the outlier multiplier is "at tolerance"
                scale = float((t.tolerance.get("rule") or {}).get("outlier") or 1.0)
            else:
                # the atol the elements were judged by (a magnitude-aware one scaled by A's RMS)
                atol = Tolerance.from_dict(t.tolerance).effective_atol
                scale = float(atol or 0.0) or float(t.tolerance.get("floor") or 0.0) or 1e-6
            worst = None
            if np.isfinite(err).any():
                wy, wx = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(err), err, -1))), err.shape)
                worst = (int(wy), int(wx))
            cv = canvas if canvas is not None and canvas.shape[0] % g[0] == 0 and canvas.shape[1] % g[1] == 0 else None
            pic = composite(cv, err, scale, worst if t.status != "match" else None)
            mx = float(np.nanmax(err)) if np.isfinite(err).any() else 0.0
            views.append(HeatView(b.name, t.name, lay[0], pic, g, mx, scale, worst, lay[1]))
    return views


def _canvas(report: Report, dump_a, run: dict) -> np.ndarray | None:
    try:
        for b in report.boundaries:
            for t in b.tensors:
                if len(t.shape.get("a", [])) != 2 or t.dtype.get("a") not in ("bfloat16", "float16", "float32", "float64"):
                    continue
                lay = image_layout(b.layout, t.shape["a"][0], run)
                if lay is None or lay[0] not in ("grid", "merge"):
                    continue
                cols = t.shape["a"][1]
                if cols % 3 or not any(3 * tt * round(math.sqrt(cols / (3 * tt))) ** 2 == cols for tt in (1, 2)):
                    continue
                c = canvas_from_patches(dump_a.load(t.name), lay[0], run)
                if c is not None:
                    return c
    except (KeyError, ValueError, OSError):
        return None
    return None


# ----------------------------------------------------------------------------- page

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d1f24;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:0 0 6px} h3{font-size:15px;margin:18px 0 6px}
.case{background:#fff;border:1px solid #dfe2e7;border-radius:8px;padding:16px 20px;margin:18px 0}
.pass{color:#137333} .fail{color:#b3261e} .warn{color:#8a5a00} .dim{color:#6b7280}
.headline{font-weight:600;padding:8px 12px;border-radius:6px;margin:8px 0}
.headline.pass{background:#e6f4ea} .headline.fail{background:#fce8e6}
table{border-collapse:collapse;margin:6px 0;font-size:13px} th,td{border-bottom:1px solid #eceef1;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f5;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums;font-family:ui-monospace,Menlo,monospace}
tr.s-diverged td,tr.s-missing td,tr.s-incomparable td{background:#fdf0ef} tr.s-consequent td{background:#fff8e6}
code{font-family:ui-monospace,Menlo,monospace;font-size:12.5px;background:#f1f3f5;padding:0 3px;border-radius:3px}
.heats{display:flex;flex-wrap:wrap;gap:16px} figure{margin:0;background:#fafbfc;border:1px solid #e5e7eb;border-radius:6px;padding:8px}
figure img{display:block;width:400px;max-width:100%;height:auto} figcaption{font-size:12.5px;margin-top:6px;max-width:400px}
.legend{height:12px;width:320px;border-radius:3px;background:linear-gradient(90deg,rgba(40,70,220,.35),#3cc8e6,#fae63c,#fa8c1e,#dc1414)}
.legend-labels{display:flex;justify-content:space-between;width:320px;font-size:11.5px;color:#555}
"""


def _g(x, fmt=".3g") -> str:
    if x is None or x == "":
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "−inf")
    return format(x, fmt)


def _jpeg_uri(data: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")


def _boundary_rows(report: Report, local) -> str:
    by_local = {r.boundary: r for r in local.boundaries} if local is not None else {}
    out = []
    for b in report.boundaries:
        lr = by_local.get(b.name)
        for i, t in enumerate(b.tensors or [None]):
            m = t.metrics if t is not None else {}
            floor = (t.tolerance or {}).get("floor") if t is not None else None
            xfloor = _g(m["max_abs"] / floor) + "×" if floor and isinstance(m.get("max_abs"), float) else "–"
            status = (b.status + (" (root)" if b.root else "")) if i == 0 else ""
            loc = ""
            if i == 0 and lr is not None:
                loc = esc(lr.status) + (f" <span class=dim>{esc(lr.summary)}</span>" if lr.summary else "")
            out.append(
                f"<tr class='s-{esc(b.status)}'><td>{esc(b.name) if i == 0 else ''}</td><td>{esc(status)}</td>"
                f"<td><code>{esc(t.name) if t is not None else ''}</code></td><td>{esc(_dt(t)) if t is not None else ''}</td>"
                f"<td class=num>{esc(_g(m.get('max_abs')))}</td><td class=num>{esc(xfloor)}</td>"
                f"<td class=num>{esc(_g(m.get('cosine'), '.6f'))}</td><td class=num>{esc(_g(m.get('sqnr_db'), '.1f'))}</td>"
                f"<td class=num>{esc(_pct(m))}</td><td>{loc}</td>"
                f"<td>{esc(t.reason) if t is not None and t.status != 'match' else ''}</td></tr>")
    return "\n".join(out)


def _dt(t) -> str:
    return dtype_text(t)


def _pct(m: dict) -> str:
    return f"{100 * m['mismatch_fraction']:.3g}%" if isinstance(m.get("mismatch_fraction"), float) else "–"


def _case_html(case, idx: int) -> str:
    r: Report | None = case.report
    parts = [f"<section class=case id='case-{idx}'><h2>{esc(case.label)}</h2>"]
    if r is None:
        parts.append(f"<div class='headline fail'>did not run: {esc(case.error or 'unknown error')}</div></section>")
        return "".join(parts)
    ok = r.verdict == "match"
    local = getattr(case, "local", None)
    num = getattr(case, "numeric", None)
    ok = ok and (local is None or local.origin is None) and (num is None or num.verdict == "match")
    parts.append(f"<div class='headline {'pass' if ok else 'fail'}'>{esc(headline(r))}</div>")
    where = f"<br>dumps: {esc(r.where)}" if r.where else ""
    parts.append(f"<p class=dim>A (reference): <code>{esc(r.a)}</code><br>B (candidate): <code>{esc(r.b)}</code>"
                 f"{where}<br>tolerances: {esc(r.tolerances)}</p>")
    if local is not None:
        parts.append(f"<p><b>Local error</b>: {esc(local.summary())}</p>")
    for n in r.earliest:
        for t in r.boundary(n).tensors:
            if t.status != "match":
                w = t.worst or {}
                extra = f" — worst element {esc(w.get('index'))}: {esc(w.get('meaning', ''))}" if w else ""
                parts.append(f"<p><code>{esc(t.name)}</code>: {esc(t.reason)}{extra}</p>")
        for d in diagnosis_lines(r.boundary(n)):
            parts.append(f"<p class=diagnosis><b>{esc(d)}</b></p>")
    parts.append("<table><tr><th>boundary</th><th>status</th><th>tensor</th><th>dtype</th><th>max|Δ|</th>"
                 "<th>× floor</th><th>cos</th><th>SQNR dB</th><th>outside</th><th>local error</th><th>reason</th></tr>")
    parts.append(_boundary_rows(r, local))
    parts.append("</table>")
    numeric = getattr(case, "numeric", None)
    if numeric is not None or any(t.mode == "floor" for b in r.boundaries for t in b.tensors):  # numeric alone
        parts.append(_numeric_html(numeric if numeric is not None else r,
                                   "the only pass" if numeric is None else "beside the semantic pass above"))
    timings = getattr(case, "timings", None) or {}
    if timings:
        cells = "".join(f"<td class=num>{esc(_g(v, '.3f'))} s</td>" for v in timings.values())
        heads = "".join(f"<th>{esc(k)}</th>" for k in timings)
        parts.append(f"<h3>Time</h3><table><tr>{heads}</tr><tr>{cells}</tr></table>")
    for note in r.notes:
        parts.append(f"<p class=warn>note: {esc(note)}</p>")
    views = getattr(case, "views", None) or []
    if views:
        parts.append("<h3>Error over the picture</h3><div class=legend></div><div class=legend-labels>"
                     "<span>≤ tol/100</span><span>tol/10</span><span>at tolerance</span><span>10× tol</span>"
                     "<span>≥ 100× tol</span></div><p class=dim>Max |Δ| per patch (token cells cover several "
                     "patches), over the picture as the model saw it; a white box marks the worst patch of a "
                     "failing tensor.</p><div class=heats>")
        for v in views:
            where = ("no difference" if v.max_err == 0 else
                     f"worst at patch (y={v.worst[0]}, x={v.worst[1]})" if v.worst else "no finite error")
            note = f"<br><span class=dim>{esc(v.note)}</span>" if v.note else ""
            parts.append(f"<figure><img alt='heatmap of {esc(v.tensor)}' src='{_jpeg_uri(v.jpeg)}'>"
                         f"<figcaption><code>{esc(v.tensor)}</code> ({esc(v.boundary)}, {esc(v.layout)} "
                         f"{v.grid[0]}×{v.grid[1]}): max|Δ| {esc(_g(v.max_err))}, tolerance {esc(_g(v.scale))}; "
                         f"{esc(where)}{note}</figcaption></figure>")
        parts.append("</div>")
    parts.append("</section>")
    return "\n".join(parts)


def _numeric_html(rep: Report, where: str) -> str:
    """The numeric pass: per tensor its error as multiples of the floor and what it can detect."""
    ok = rep.verdict == "match"
    rows = []
    for b in rep.boundaries:
        for i, t in enumerate(b.tensors):
            m = t.metrics
            floor = isinstance(m, dict) and "ratios" in m
            r, d = (m["ratios"], m["detectable"]) if floor else ({}, {})
            w = (m.get("worst_rows") or [None])[0] if floor and not m.get("exact_floor") else None
            cells = ([_g(r.get(k), ".3f") + "×" for k in ("rmse", "row", "cosine")]
                     + [f"{m['outliers']}/{m['rows']}",
                        f"{w['row']} ({w['meaning']}): {_g(w['x_floor'], '.3g')}×" if w else "–",
                        "exact" if m.get("exact_floor") else f"{100 * d['tensor']:.3g}% / {100 * d['row']:.3g}%"]
                     if floor and not m.get("exact_floor") else ["–"] * 5 + ["exact" if floor else "direct"])
            status = (b.status + (" (root)" if b.root else "")) if i == 0 else ""
            rows.append(f"<tr class='s-{esc(b.status)}'><td>{esc(b.name) if i == 0 else ''}</td><td>{esc(status)}</td>"
                        f"<td><code>{esc(t.name)}</code></td>" + "".join(f"<td class=num>{esc(c)}</td>" for c in cells)
                        + f"<td>{esc(t.reason) if t.status != 'match' else ''}</td></tr>")
    return (f"<h3>Numeric pass ({esc(where)}): error as multiples of the floor</h3>"
            f"<div class='headline {'pass' if ok else 'fail'}'>{esc(head(rep))}</div>"
            "<p class=dim>floor = the oracle in the run's precision against the oracle in float32; detectable = the "
            "smallest relative perturbation this pass sees at this precision, spread over the tensor / in one row.</p>"
            "<table><tr><th>boundary</th><th>status</th><th>tensor</th><th>RMSE</th><th>max row</th>"
            "<th>cos deficit</th><th>outlier rows</th><th>worst row</th><th>detectable</th><th>reason</th></tr>"
            + "\n".join(rows) + "</table>"
            + "".join(f"<p class=warn>note: {esc(n)}</p>" for n in rep.notes))


def render_html(cases, title: str = "tensordiff report") -> str:
    cases = list(cases)
    failing = [c for c in cases if c.report is None or c.report.verdict != "match"
               or (getattr(c, "numeric", None) is not None and c.numeric.verdict != "match")
               or (getattr(c, "local", None) is not None and c.local.origin is not None)]
    verdict = "PASS" if not failing else f"FAIL ({len(failing)} of {len(cases)} cases)"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = "".join(f"<li><a href='#case-{i}' class='{'fail' if c in failing else 'pass'}'>{esc(c.label)}</a></li>"
                  for i, c in enumerate(cases))
    body = "\n".join(_case_html(c, i) for i, c in enumerate(cases))
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{esc(title)}: <span class='{'pass' if not failing else 'fail'}'>{esc(verdict)}</span></h1>"
            f"<p class=dim>tensordiff {esc(VERSION)}, {esc(now)}</p><ul>{toc}</ul>{body}</body></html>\n")


def write_html(cases, path: str | Path, title: str = "tensordiff report") -> None:
    write_text_atomic(path, render_html(cases, title), "the HTML report")
