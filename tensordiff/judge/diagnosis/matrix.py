"""A stored tensor seen as a matrix of rows (leading dimension) by columns (the rest), read in
row ranges as float64: the diagnosis never holds more than a chunk of rows of either side."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from tensordiff.format.dtypes import to_float64
from tensordiff.judge.rows import shape_rows
from tensordiff.format.storage import StoredTensor
from tensordiff.judge.stream import chunk_len, release

SAMPLE_ROWS = 256  # rows a search looks at; the confirmation streams every row
SAMPLE_ELEMENTS = 1 << 19  # ... and fewer of wide rows (an aligner's 5120, logits): 4 MB of float64 a side


class Matrix:
    def __init__(self, st: StoredTensor):
        self.st = st
        self.rows, self.cols = shape_rows(st.shape)
        self._r = st.reader()

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> "Matrix":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, r0: int, r1: int) -> np.ndarray:
        c = self.cols
        raw = self._r.read(r0 * c, r1 * c)
        out = to_float64(raw, self.st.dtype).reshape(r1 - r0, c)
        release(self._r, r0 * c, r1 * c)
        out[~np.isfinite(out)] = 0.0  # in place: a chunk is held once
        return out

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` (any order, repeats allowed), read as runs of consecutive rows."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((idx.size, self.cols))
        if idx.size == 0:
            return out
        order = np.argsort(idx, kind="stable")
        s = idx[order]
        breaks = np.flatnonzero(np.diff(s) > 1) + 1
        for run in np.split(np.arange(s.size), breaks):
            lo, hi = int(s[run[0]]), int(s[run[-1]]) + 1
            block = self.read(lo, hi)
            out[order[run]] = block[s[run] - lo]
        return out

    def chunks(self) -> Iterator[tuple[int, int]]:
        step = max(1, chunk_len(self.cols) // max(self.cols, 1))
        for r0 in range(0, self.rows, step):
            yield r0, min(self.rows, r0 + step)


def sample_rows(n: int, cols: int = 1) -> np.ndarray:
    """Rows for a search: seeded at random (no aliasing with a grid's width), sorted; all when few."""
    k = max(8, min(SAMPLE_ROWS, SAMPLE_ELEMENTS // max(cols, 1)))
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, k, replace=False))


# A prediction of B's rows [r0, r1) from A, as a hypothesis sees it; rows it cannot say anything
# about are returned as A's own rows (their error stays unexplained).
Predict = Callable[[int, int], np.ndarray]


def sq(x: np.ndarray, y: np.ndarray) -> float:
    """sum (x - y)^2, without a second temporary."""
    d = x - y
    return float(np.einsum("ij,ij->", d, d))


def residual(a: Matrix, b: Matrix, predict: Predict) -> tuple[float, float]:
    """(error, residual): sum (B - A)^2 and sum (B - prediction)^2 over the whole tensor, streamed."""
    err = res = 0.0
    for r0, r1 in b.chunks():
        xb = b.read(r0, r1)
        err += sq(xb, a.read(r0, r1))
        res += sq(xb, predict(r0, r1))
    return err, res
