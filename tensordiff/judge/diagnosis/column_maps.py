"""Column hypotheses: inside every row, B's columns are A's columns in another order.

A column map is a permutation `p` with B[:, j] = A[:, p[j]]. Named candidates come from the row
length: blocked vs interleaved halves (RoPE layouts), the two halves swapped (height and width
angles), a patch's flattening order ((c, y, x) vs (y, x, c); (c, t) vs (t, c) of a video patch)
and an R/B channel swap, channel-major vs position-major unfold of merged cells. A short row
is also matched column by column on a sample, which names any other permutation.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

MATCH_COLS = 1024  # rows up to this long are matched column by column (cost: sample x cols^2)
MATCH_REL = 1e-3


@dataclass(frozen=True)
class ColumnMap:
    name: str
    text: str
    perm: np.ndarray


def _group_maps(c: int) -> list[ColumnMap]:
    out = []
    for g in (c, c // 2):
        if g < 4 or g % 2 or c % g:
            continue
        where = "each row" if g == c else f"each {g}-column half of the row"
        half = g // 2
        inter = np.empty(g, dtype=np.int64)
        inter[0::2], inter[1::2] = np.arange(half), half + np.arange(half)
        base = np.arange(0, c, g)[:, None]
        out.append(ColumnMap("interleaved-halves", f"in {where}, B's columns interleave A's two halves "
                             "(first, second, first, second, ...) where A keeps them blocked (all of the first "
                             "half, then the second): interleaved vs blocked RoPE angles",
                             (base + inter[None, :]).reshape(-1)))
        out.append(ColumnMap("blocked-halves", f"in {where}, B's columns are blocked (all even columns, then the odd) "
                             "where A interleaves them: blocked vs interleaved RoPE angles",
                             (base + np.argsort(inter)[None, :]).reshape(-1)))
        swap = np.concatenate([np.arange(half, g), np.arange(half)])
        out.append(ColumnMap("swapped-halves", f"in {where}, B's two halves are A's swapped (e.g. height and width "
                             "angles of a 2D RoPE, or its two rotation halves)", (base + swap[None, :]).reshape(-1)))
    return out


def _patch_shapes(c: int) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
    out = []
    for shape, names in (((3,), ("c",)), ((3, 2), ("c", "t"))):
        rest = c // math.prod(shape)
        p = math.isqrt(rest) if rest * math.prod(shape) == c else 0
        if p > 1 and p * p == rest:
            out.append((shape + (p, p), names + ("y", "x")))
    for a in (4, 9):  # merged cells: 2x2 or 3x3 positions by channels
        if c % a == 0 and c // a > 1:
            out.append(((a, c // a), ("position", "channel")))
            out.append(((c // a, a), ("channel", "position")))
    return out


def _layout_maps(c: int) -> list[ColumnMap]:
    out = []
    for shape, names in _patch_shapes(c):
        flat = np.arange(c).reshape(shape)
        for order in itertools.permutations(range(len(shape))):
            if order == tuple(range(len(shape))):
                continue
            perm = flat.transpose(order).reshape(-1)
            b = ", ".join(names[k] for k in order)
            what = "unfold" if "position" in names else "patch flattening"
            out.append(ColumnMap("flatten-order", f"B's columns are flattened as ({b}) where A's are "
                                 f"({', '.join(names)}) ({what} order)", perm))
        if names[0] == "c":
            out.append(ColumnMap("rb-swap", "B's colour channels are A's reversed (R and B swapped: BGR vs RGB)",
                                 flat[::-1].reshape(-1)))
    return out


def named_maps(c: int) -> list[ColumnMap]:
    return _group_maps(c) + _layout_maps(c)


def matched_map(xa: np.ndarray, xb: np.ndarray) -> ColumnMap | None:
    """The permutation that matches each sampled B column to the A column it equals, when that is
    a permutation of most columns other than the identity."""
    c = xa.shape[1]
    if c > MATCH_COLS or c < 2:
        return None
    nb = (xb ** 2).sum(0)
    d = nb[:, None] + (xa ** 2).sum(0)[None, :] - 2 * xb.T @ xa
    p = np.argmin(d, axis=1)
    good = d[np.arange(c), p] <= MATCH_REL * np.maximum(nb, 1e-300)
    if good.mean() < 0.9 or np.unique(p[good]).size < good.sum() or (p[good] == np.flatnonzero(good)).all():
        return None
    p = np.where(good, p, np.arange(c))
    moved = np.flatnonzero(p != np.arange(c))
    ex = ", ".join(f"{j}←{p[j]}" for j in moved[:6]) + (", …" if moved.size > 6 else "")
    return ColumnMap("column-permutation", f"B's columns are A's permuted inside every row ({moved.size} of {c} "
                     f"moved: B column ← A column {ex})", p)
