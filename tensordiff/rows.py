"""Per-row error statistics of one tensor against a reference, streamed in row-aligned chunks.

A "row" is one slice of the leading dimension (a patch, a token cell, a sequence position). Row
errors matter because a bug confined to one row (one wrong patch, one wrong token) is a tiny
fraction of a tensor's elements and vanishes in any tensor-wide statistic, while against the
row-by-row noise floor it stands out.

    acc = RowErrors(n_rows, row_len)
    acc.update(start, ref_chunk, other_chunk)   # float64 chunks of flat elements, start % row_len == 0
    acc.rmse, acc.cosine, acc.row_rmse, acc.row_ref_rms
"""
from __future__ import annotations

import math

import numpy as np


class RowErrors:
    """Sums of squares per row and in total, in float64 (exact for float32/bfloat16 inputs)."""

    def __init__(self, n_rows: int, row_len: int):
        self.n_rows, self.row_len = max(n_rows, 1), max(row_len, 1)
        self.sq_err = np.zeros(self.n_rows)  # per row: sum (b - a)^2
        self.sq_ref = np.zeros(self.n_rows)  # per row: sum a^2
        self.sq_oth = 0.0
        self.dot = 0.0
        self.nonfinite = 0  # elements finite in the reference but not in the other side
        self.n = 0
        self.range_ref = [math.inf, -math.inf]  # finite values seen on each side (for the probes)
        self.range_oth = [math.inf, -math.inf]

    def update(self, start: int, a: np.ndarray, b: np.ndarray) -> None:
        if a.size == 0:
            return
        if start % self.row_len or a.size % self.row_len:
            raise ValueError("RowErrors needs chunks of whole rows")
        bad = np.isfinite(a) & ~np.isfinite(b)
        if bad.any():
            self.nonfinite += int(bad.sum())
        ok = np.isfinite(a) & np.isfinite(b)
        a = np.where(ok, a, 0.0)
        b = np.where(ok, b, 0.0)
        for rng, x in ((self.range_ref, a), (self.range_oth, b)):
            rng[0], rng[1] = min(rng[0], float(x.min())), max(rng[1], float(x.max()))
        r0 = start // self.row_len
        rows = a.size // self.row_len
        d = (b - a).reshape(rows, self.row_len)
        self.sq_err[r0:r0 + rows] += np.einsum("ij,ij->i", d, d)
        ar = a.reshape(rows, self.row_len)
        self.sq_ref[r0:r0 + rows] += np.einsum("ij,ij->i", ar, ar)
        self.sq_oth += float(np.dot(b, b))
        self.dot += float(np.dot(a, b))
        self.n += a.size

    # ------------------------------------------------------------------ results

    @property
    def rmse(self) -> float:
        return math.sqrt(float(self.sq_err.sum()) / max(self.n, 1))

    @property
    def ref_rms(self) -> float:
        return math.sqrt(float(self.sq_ref.sum()) / max(self.n, 1))

    @property
    def cosine_deficit(self) -> float:
        """1 - cos(a, b), from the error's square (accurate near cos = 1, where it matters)."""
        na, nb = math.sqrt(float(self.sq_ref.sum())), math.sqrt(self.sq_oth)
        if na == 0 and nb == 0:
            return 0.0
        if na == 0 or nb == 0:
            return 1.0
        return max(0.0, (float(self.sq_err.sum()) - (na - nb) ** 2) / (2 * na * nb))

    @property
    def row_rmse(self) -> np.ndarray:
        return np.sqrt(self.sq_err / self.row_len)

    @property
    def row_ref_rms(self) -> np.ndarray:
        return np.sqrt(self.sq_ref / self.row_len)

    @property
    def exact(self) -> bool:
        return self.nonfinite == 0 and not self.sq_err.any()


def shape_rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, row length): the leading dimension, the rest flattened (a vector is one row)."""
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(shape[0]), int(np.prod(shape[1:]))
