"""Scale, sign and offset: B = s·A, B = -A, B = A + o, per channel (column) or per row (a
normalisation constant, a tail loop that scales one row). Every fit is closed-form from sums
streamed in one pass, so its residual over the whole tensor is exact, not sampled."""
from __future__ import annotations

import numpy as np

from tensordiff.judge.layout import describe
from tensordiff.judge.diagnosis.finding import Finding, explained
from tensordiff.judge.diagnosis.matrix import Matrix

NOT_ONE = 1e-3  # a fitted scale this close to 1 is no scale


class Sums:
    def __init__(self, rows: int, cols: int):
        self.n = 0
        z = np.zeros
        self.col = {k: z(cols) for k in ("a", "b", "aa", "ab", "bb")}
        self.row = {k: z(rows) for k in ("aa", "ab", "bb")}

    def update(self, r0: int, xa: np.ndarray, xb: np.ndarray) -> None:
        self.n += xa.shape[0]
        c = self.col
        c["a"] += xa.sum(0)
        c["b"] += xb.sum(0)
        c["aa"] += np.einsum("ij,ij->j", xa, xa)
        c["ab"] += np.einsum("ij,ij->j", xa, xb)
        c["bb"] += np.einsum("ij,ij->j", xb, xb)
        r1 = r0 + xa.shape[0]
        for k, (x, y) in (("aa", (xa, xa)), ("ab", (xa, xb)), ("bb", (xb, xb))):
            self.row[k][r0:r1] = np.einsum("ij,ij->i", x, y)


def _scaled_residual(aa, ab, bb):
    """Residual of the best scale per entry, and the scales (1 where A is zero there)."""
    s = np.divide(ab, aa, out=np.ones_like(ab), where=aa > 0)
    return np.maximum(bb - s * ab, 0.0), s


def _range(s: np.ndarray) -> str:
    return f"{s.min():.6g}" if np.ptp(s) < 1e-6 * max(abs(s).max(), 1) else f"{s.min():.4g} to {s.max():.4g}"


def findings(name: str, a: Matrix, b: Matrix, layout: str, run: dict) -> list[Finding]:
    acc = Sums(a.rows, a.cols)
    for r0, r1 in b.chunks():
        acc.update(r0, a.read(r0, r1), b.read(r0, r1))
    c = acc.col
    aa, ab, bb = c["aa"].sum(), c["ab"].sum(), c["bb"].sum()
    err = bb - 2 * ab + aa
    if err <= 0:
        return []
    if bb == 0:  # nothing there at all: no scale is worth naming
        return [Finding(name, "scale", "zeros", "B is all zeros where A is not (never written: consistent with a stage "
                        "skipped or its output dropped)", 1.0)]
    out = []
    out.append(Finding(name, "sign", "sign-flip", "B equals A with its sign flipped (B = -A)",
                       explained(err, bb + 2 * ab + aa)))
    if aa > 0:
        s = ab / aa
        if abs(s - 1) > NOT_ONE and abs(s + 1) > NOT_ONE:
            out.append(Finding(name, "scale", "scale", f"B equals A scaled by {s:.6g}", explained(err, bb - s * ab)))
    total = a.rows * a.cols
    diff = (c["b"] - c["a"])
    o = diff.sum() / max(total, 1)
    out.append(Finding(name, "offset", "offset", f"B equals A plus a constant {o:.6g}", explained(err, err - total * o * o)))
    if a.cols > 1 and a.rows > 1:
        res, s = _scaled_residual(c["aa"], c["ab"], c["bb"])
        off = np.abs(s - 1) > NOT_ONE
        if off.any():
            which = (f"all {a.cols} channels" if off.all()
                     else f"channels {', '.join(map(str, np.flatnonzero(off)[:8]))}{'…' if off.sum() > 8 else ''}")
            keep = (c["bb"] - 2 * c["ab"] + c["aa"])[~off].sum()  # channels left as they are
            out.append(Finding(name, "scale", "channel-scale", f"B equals A scaled per channel (column): {which} by "
                               f"{_range(s[off])}", explained(err, res[off].sum() + keep)))
        oc = diff / a.rows
        out.append(Finding(name, "offset", "channel-offset", f"B equals A plus a per-channel (column) offset of "
                           f"{_range(oc)}", explained(err, err - a.rows * (oc ** 2).sum())))
    r = acc.row
    res, s = _scaled_residual(r["aa"], r["ab"], r["bb"])
    off = np.abs(s - 1) > NOT_ONE
    if off.any() and a.cols > 1:
        rows = np.flatnonzero(off)
        if off.all():
            where = (f"every row scaled (by {_range(s)}: consistent with a per-row normalisation constant, e.g. a "
                     "norm's epsilon)")
        elif rows.size == 1:
            where = f"row {rows[0]} ({describe(layout, (int(rows[0]),), run)}) scaled by {_range(s[off])}"
        elif rows[-1] - rows[0] + 1 == rows.size:
            where = (f"rows {rows[0]}–{rows[-1]} ({describe(layout, (int(rows[0]),), run)} to "
                     f"{describe(layout, (int(rows[-1]),), run)}) scaled by {_range(s[off])}")
        else:
            where = f"{rows.size} rows (first {', '.join(map(str, rows[:6]))}) scaled by {_range(s[off])}"
        keep = (r["bb"] - 2 * r["ab"] + r["aa"])[~off].sum()
        out.append(Finding(name, "scale", "row-scale", f"B equals A with {where}", explained(err, res[off].sum() + keep)))
    return out
