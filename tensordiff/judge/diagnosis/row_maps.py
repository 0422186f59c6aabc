"""Row hypotheses: B's rows are A's rows moved. A row map says, for each of B's rows, which of A's
rows it holds (-1: a zero row, a pad; -2: the hypothesis says nothing, the row's error stays).

Two sources of candidates: the grid the contract's row layout names (`run.inputs.grid` for
"grid"/"merge", the token cells for "cells"/"merged"): 2x2-merge order vs raster, a transposed
(h, w) grid, a pad misplaced in a grid of width w vs w'; and a match of sampled B rows against
every A row (a sketch: a few random projections per row, then the nearest candidates checked in
full), whose offsets give a global shift by k and shifts over row ranges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tensordiff.judge.layout import describe
from tensordiff.judge.diagnosis.matrix import Matrix

ZERO, UNKNOWN = -1, -2
SKETCH = 16  # random projections per row for the search
CANDIDATES = 4  # nearest rows (in the sketch) checked in full
MATCH_REL = 1e-3  # a row matches when |b - a|^2 <= MATCH_REL |b|^2 (3% of its norm: bf16 noise is far below)
A_BLOCK = 8192  # A rows per step of the nearest-row search (bounds its memory)
EXTEND_BLOCK = 4096  # rows read at once while a matched range is extended to its true edges

SrcFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class RowMap:
    name: str
    text: str
    src: SrcFn
    # what a stage that reads its input through this map's inverse does (`replay`): feeding it
    # A's input re-laid by this map undoes the misreading; "" for maps replay does not try
    reads: str = ""
    # one vector B repeats over rows A has nothing like (a placeholder never overwritten): B's
    # rows equal to it are predicted as it
    fill: np.ndarray | None = None


def predict_rows(a: Matrix, m: RowMap, idx: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """A's prediction of B's rows `idx` (whose values are `xb`) under the row map `m`."""
    s = m.src(idx)
    rows = a.take(np.where(s >= 0, s, idx))
    rows[s == ZERO] = 0.0
    if m.fill is not None:
        same = (xb == m.fill[None, :]).all(1)
        rows[same] = m.fill
    return rows


def _grid(run: dict, key: str) -> tuple[int, int] | None:
    g = (run.get("inputs") or {}).get(key)
    if isinstance(g, (list, tuple)) and len(g) == 2 and all(isinstance(v, int) and v > 0 for v in g):
        return int(g[0]), int(g[1])
    return None


def layout_grid(layout: str, n: int, run: dict) -> tuple[int, int] | None:
    """(h, w) of the grid the rows of a tensor of `layout` and `n` rows run over, when it fits."""
    if layout in ("grid", "merge"):
        g = _grid(run, "grid")
    elif layout == "cells":
        g = _grid(run, "cells")
    elif layout == "merged":
        g0 = _grid(run, "grid")
        g = (g0[0] // 2, g0[1] // 2) if g0 else None
    else:
        return None
    return g if g and g[0] * g[1] == n else None


def merge_to_raster(h: int, w: int) -> np.ndarray:
    """raster index of each merge-order position (2x2 groups in raster order, each group raster)."""
    i = np.arange(h * w)
    blk, intra = np.divmod(i, 4)
    by, bx = np.divmod(blk, w // 2)
    return (by * 2 + intra // 2) * w + bx * 2 + intra % 2


def grid_maps(layout: str, n: int, run: dict) -> list[RowMap]:
    g = layout_grid(layout, n, run)
    if g is None:
        return []
    h, w = g
    out: list[RowMap] = []
    if layout in ("grid", "merge") and h % 2 == 0 and w % 2 == 0 and w > 2:
        m2r = merge_to_raster(h, w)
        r2m = np.argsort(m2r)
        if layout == "merge":  # A in merge order: B in plain raster order
            out.append(RowMap("merge-vs-raster", f"B's rows are in plain raster order over the {h}x{w} patch grid "
                              "where A's are in 2x2-merge order (each 2x2 group contiguous)", lambda i: r2m[i],
                              f"reads its {h}x{w} input as if it were in raster order, where it is in 2x2-merge order"))
        else:
            out.append(RowMap("raster-vs-merge", f"B's rows are in 2x2-merge order (each 2x2 group contiguous) where "
                              f"A's are in raster order over the {h}x{w} grid", lambda i: m2r[i],
                              f"reads its {h}x{w} input as if it were in 2x2-merge order, where it is in raster order"))
    if layout in ("grid", "cells", "merged") and h > 1 and w > 1:
        out.append(RowMap("transposed-grid", f"B's rows run over the {h}x{w} grid transposed: B's row i is A's patch "
                          f"(y, x) = (i mod {h}, i div {h}) (height and width swapped)",
                          lambda i: (i % h) * w + i // h,
                          f"reads its {h}x{w} input grid transposed (height and width swapped)"))
        out.append(RowMap("transposed-grid", f"B's rows run over the {h}x{w} grid read as {w}x{h}: B's row i is A's "
                          f"row (i mod {w})·{h} + i div {w} (height and width swapped)",
                          lambda i: (i % w) * h + i // w,
                          f"reads its {h}x{w} input grid as {w}x{h} (height and width swapped)"))
        for w2 in sorted({w - 1, w + 1, w + 2, -(-w // 2) * 2, -(-w // 3) * 3, -(-w // 4) * 4} - {w}):
            if w2 <= 1:
                continue
            out.append(RowMap("pad-misplaced", f"B is A's grid read with a row width of {w2} instead of {w}: grid row y "
                              f"of B starts at A's flat row y·{w2} (shifted by {w2 - w}·y; consistent with padding "
                              f"appended to the flat sequence instead of to each grid row)", _stride(h, w, w2, n)))
            if w2 > w:
                out.append(RowMap("pad-misplaced", f"B is A's {w}-wide grid padded to width {w2} at each row's end and "
                                  f"read back as {w}-wide rows (grid row y shifted right by {w2 - w}·y, zero rows where "
                                  "the pad lands)", _padded(w, w2, n),
                                  f"reads its {w}-wide input grid as a flat sequence padded at its end and re-read "
                                  f"as a grid of width {w2}: grid row y lands shifted by {w2 - w}·y (consistent with "
                                  f"padding appended to the flat sequence instead of a pad at each grid row's end)"))
    return out


def _stride(h: int, w: int, w2: int, n: int) -> SrcFn:
    def src(i: np.ndarray) -> np.ndarray:
        y, x = np.divmod(i, w)
        f = y * w2 + x
        return np.where(f < n, f, ZERO)
    return src


def _padded(w: int, w2: int, n: int) -> SrcFn:
    def src(i: np.ndarray) -> np.ndarray:
        y, x = np.divmod(i, w2)
        f = y * w + x
        return np.where((x < w) & (f < n), f, ZERO)
    return src


# ----------------------------------------------------------------------------- matched shifts

def match_rows(a: Matrix, rows: np.ndarray, xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """For each sampled B row (`rows`, values `xb`; A's own rows `xa`): the A row it equals, ZERO for a zero row,
    UNKNOWN when none does. Its own index wins a tie (identical rows)."""
    rng = np.random.default_rng(1)
    proj = rng.standard_normal((a.cols, SKETCH))
    sb = xb @ proj
    best_d = np.full((rows.size, CANDIDATES), np.inf)
    best_i = np.zeros((rows.size, CANDIDATES), dtype=np.int64)
    for r0 in range(0, a.rows, A_BLOCK):
        r1 = min(a.rows, r0 + A_BLOCK)
        sa = a.read(r0, r1) @ proj
        d = (sb ** 2).sum(1)[:, None] + (sa ** 2).sum(1)[None, :] - 2 * sb @ sa.T
        k = min(CANDIDATES, r1 - r0)
        part = np.argpartition(d, k - 1, axis=1)[:, :k]
        cd = np.concatenate([best_d, np.take_along_axis(d, part, 1)], 1)
        ci = np.concatenate([best_i, part + r0], 1)
        keep = np.argsort(cd, axis=1)[:, :CANDIDATES]
        best_d, best_i = np.take_along_axis(cd, keep, 1), np.take_along_axis(ci, keep, 1)
    norm = (xb ** 2).sum(1)
    scale = float(norm.mean()) if norm.size else 0.0
    bar = MATCH_REL * norm
    err = np.empty(best_i.shape)
    step = max(1, A_BLOCK * SKETCH // max(a.cols * CANDIDATES, 1))  # candidate rows held at once: bounded
    for s0 in range(0, rows.size, step):
        sl = slice(s0, s0 + step)
        cand = a.take(best_i[sl].reshape(-1)).reshape(-1, best_i.shape[1], a.cols)
        err[sl] = ((cand - xb[sl, None, :]) ** 2).sum(2)
    j = np.argmin(err, axis=1)
    k = np.arange(rows.size)
    out = np.where(err[k, j] <= bar, best_i[k, j], UNKNOWN)
    out = np.where(((xb - xa) ** 2).sum(1) <= bar, rows, out)  # its own row wins a tie
    return np.where(norm <= 1e-12 * max(scale, 1e-300), ZERO, out)


def _extend(a: Matrix, b: Matrix, edge: int, limit: int, d: int) -> int:
    """How far a range of B rows equal to A's rows shifted by `d` reaches from `edge` towards
    `limit` (inclusive), the rows in between read as blocks: the last row that still matches."""
    step = 1 if limit >= edge else -1
    lo_ok, hi_ok = max(0, -d), min(b.rows, a.rows - d) - 1  # rows whose partner exists
    limit = min(max(limit, lo_ok), hi_ok)
    pos = edge
    while (limit - pos) * step > 0:
        n = min(EXTEND_BLOCK, (limit - pos) * step)
        r0, r1 = (pos + 1, pos + 1 + n) if step > 0 else (pos - n, pos)
        xb, xa = b.read(r0, r1), a.read(r0 + d, r1 + d)
        nb = (xb ** 2).sum(1)
        ok = (nb > 0) & (((xb - xa) ** 2).sum(1) <= MATCH_REL * nb)
        run = ok if step > 0 else ok[::-1]
        bad = np.flatnonzero(~run)
        if bad.size:
            return pos + step * int(bad[0])
        pos += step * n
    return pos


def _placeholder(rows: np.ndarray, match: np.ndarray, xb: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The one vector most unmatched sampled B rows repeat exactly (at least 3 of them), and where."""
    lost = np.flatnonzero(match == UNKNOWN)
    if lost.size < 3:
        return None, lost[:0]
    # Rows grouped by their bytes, not by np.unique(axis=0): that sorts the rows as records of one
    # field a column, seconds for a few dozen rows of a 151,936-wide logits matrix. The same
    # groups: -0.0 counts as 0.0 (adding 0.0 makes it so) and a row holding a NaN equals no other.
    x = np.ascontiguousarray(xb[lost]) + 0.0
    groups: dict[bytes, list[int]] = {}
    for i in np.flatnonzero(~np.isnan(x).any(1)):
        groups.setdefault(x[i].tobytes(), []).append(int(i))
    most = max((len(g) for g in groups.values()), default=0)
    if most < 3:
        return None, lost[:0]
    tied = [g for g in groups.values() if len(g) == most]
    # several vectors repeated as often: the least in lexicographic order (np.unique's first), as before
    pick = tied[int(np.lexsort(np.stack([x[g[0]] for g in tied]).T[::-1])[0])] if len(tied) > 1 else tied[0]
    return xb[lost[pick[0]]], rows[lost[pick]]


def _period(segs: list[tuple[int, int, int]]) -> int:
    """The period p when most ranges (3/4) copy the same A rows, each p rows after the last."""
    if len(segs) < 3:
        return 0
    srcs = [(lo + d, hi + d) for lo, hi, d in segs]
    common = max(set(srcs), key=srcs.count)
    los = [lo for (lo, _, _), s in zip(segs, srcs) if s == common]
    steps = np.diff(los)
    if len(los) < 0.75 * len(segs) or not steps.size:
        return 0
    vals, counts = np.unique(steps, return_counts=True)
    k = int(np.argmax(counts))
    return int(vals[k]) if counts[k] >= 0.75 * steps.size and vals[k] > 0 else 0


def shift_maps(a: Matrix, b: Matrix, rows: np.ndarray, match: np.ndarray, layout: str, run: dict,
               xb: np.ndarray) -> list[RowMap]:
    ok = match >= 0
    off = np.where(ok, match - rows, 0)
    moved = ok & (off != 0)
    fill, where = _placeholder(rows, match, xb)
    if moved.sum() < 2 and fill is None:
        return []
    out: list[RowMap] = []
    vals, counts = np.unique(off[moved], return_counts=True)
    n = b.rows
    for d in vals[np.argsort(-counts)][:3]:
        d = int(d)
        out.append(RowMap("shift", f"B equals A shifted by {abs(d)} row{'s' if abs(d) != 1 else ''} "
                          f"({'later' if d < 0 else 'earlier'} rows: B's row i is A's row i {'+' if d > 0 else '-'} {abs(d)})",
                          lambda i, d=d: np.where((i + d >= 0) & (i + d < n), i + d, UNKNOWN)))
    # ranges of rows with one offset: consecutive sampled rows sharing it, edges found row by row
    segs: list[tuple[int, int, int]] = []
    k = 0
    idx = np.flatnonzero(moved)

    def same_offset(i: int, d: int) -> bool:
        # a row equal to several of A's (a separator token, a repeated vector) continues the
        # range it sits in when it also equals A's row at that range's offset: the simpler story
        if int(off[i]) == d:
            return True
        r = int(rows[i])
        if not 0 <= r + d < a.rows:
            return False
        xr = xb[i]
        return bool(((xr - a.read(r + d, r + d + 1)[0]) ** 2).sum() <= MATCH_REL * (xr ** 2).sum())

    while k < idx.size:
        d = int(off[idx[k]])
        lo = hi = int(rows[idx[k]])
        k2 = k
        while k2 + 1 < idx.size and same_offset(idx[k2 + 1], d) and not (
                (ok & (off == 0))[idx[k2] + 1:idx[k2 + 1]].any()):
            k2 += 1
            hi = int(rows[idx[k2]])
        # the true edges lie between this range's outer samples and their neighbours in the sample
        first, last = idx[k], idx[k2]
        lo = _extend(a, b, lo, int(rows[first - 1]) + 1 if first > 0 else 0, d)
        hi = _extend(a, b, hi, int(rows[last + 1]) - 1 if last + 1 < rows.size else b.rows - 1, d)
        k = k2 + 1
        segs.append((lo, hi, d))
    whole = len(segs) == 1 and segs[0][0] == max(0, -segs[0][2]) and segs[0][1] == min(n, n - segs[0][2]) - 1
    if (segs and not whole) or fill is not None:
        starts = np.array([s[0] for s in segs])
        ends = np.array([s[1] for s in segs])
        ds = np.array([s[2] for s in segs])

        def src(i: np.ndarray) -> np.ndarray:
            if not segs:
                return np.full(i.shape, UNKNOWN)
            j = np.searchsorted(starts, i, side="right") - 1
            inside = (j >= 0) & (i <= ends[np.clip(j, 0, None)])
            return np.where(inside, i + ds[np.clip(j, 0, None)], UNKNOWN)

        parts = [f"rows {lo}–{hi} (from {describe(layout, (lo,), run)}) equal A's rows {lo + d}–{hi + d} "
                 f"(shifted by {d:+d})" for lo, hi, d in segs[:3]]
        if len(segs) > 3:
            parts[-1] += f", and {len(segs) - 3} more ranges like them"
        period = _period(segs)
        if period:
            lo, hi, d = segs[0]
            parts.insert(0, f"rows repeat A's rows {lo + d}–{hi + d} every {period} rows from row {lo} on (consistent "
                         f"with them placed at one fixed offset inside every {period}-row chunk)")
        if fill is not None:
            lo, hi = int(where.min()), int(where.max())
            parts.append(f"rows between {lo} ({describe(layout, (lo,), run)}) and {hi} ({describe(layout, (hi,), run)}) "
                         "hold one repeated vector found nowhere in A (a placeholder never overwritten)")
        name = "row-range-shift" if segs else "placeholder-rows"
        out.append(RowMap(name, "B's " + "; ".join(parts), src, fill=fill))
    return out
