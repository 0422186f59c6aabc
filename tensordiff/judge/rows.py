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

# The fewest elements a row statistic is taken over. A row's RMSE from n elements scatters as a
# chi distribution with n degrees of freedom: the ratio of two independent clean rows' RMSEs (the
# engine's and the floor run's) exceeds 2 with probability 1/5 at n = 2 (the F(2, 2) tail
# 1/(1 + 4)), 2e-3 at n = 16 and ~1e-7 at n = 64. Shorter rows (router weights [S, top-k],
# Engram gates [S, hc]) are therefore judged in blocks of consecutive rows of at least this many
# elements: a clean engine's 2-element rows did pass 2x their floor (H200, rocket,
# router.0.weights, worst row 2.54x) while a wrong row's error, far above the noise, still
# stands out of its block.
MIN_ROW_ELEMS = 64


def rows_per_block(row_len: int) -> int:
    """How many consecutive rows one row statistic pools (1 for rows of MIN_ROW_ELEMS or more)."""
    return max(1, -(-MIN_ROW_ELEMS // max(row_len, 1)))


def block_starts(n_rows: int, per: int) -> np.ndarray:
    """The first row of each block of `per` rows; a remainder joins the last block (a short tail
    block would be as noisy a sample as the short rows themselves)."""
    return np.arange(max(1, n_rows // per)) * per


def pooled(per_row: np.ndarray, per: int) -> np.ndarray:
    """Per-row sums pooled over the blocks of `block_starts`."""
    if per <= 1:
        return per_row
    return np.add.reduceat(per_row, block_starts(per_row.shape[0], per))


def block_sizes(n_rows: int, per: int) -> np.ndarray:
    """The number of rows in each block of `block_starts`."""
    starts = block_starts(max(n_rows, 1), per)
    return np.diff(np.append(starts, max(n_rows, 1)))


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

    def block_rmse(self, per: int) -> tuple[np.ndarray, np.ndarray]:
        """(error RMSE, reference RMS) per block of `per` consecutive rows (`rows_per_block`)."""
        n = block_sizes(self.n_rows, per) * self.row_len
        return np.sqrt(pooled(self.sq_err, per) / n), np.sqrt(pooled(self.sq_ref, per) / n)

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
