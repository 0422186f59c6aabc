"""Streaming metrics: each accumulator sees a tensor chunk by chunk, so memory stays bounded
whatever the tensor's size. Side A is the reference (the oracle); B the candidate.
"""
from __future__ import annotations

import math

import numpy as np

from .dtypes import DType, spacing, to_float64
from .tolerance import Tolerance

# ULP histogram: quarter-ULP bins below 16 ULP, then 16 bins per octave (~4.4% wide).
_LIN_BINS = 64
_LOG_PER_OCTAVE = 16
_NBINS = _LIN_BINS + _LOG_PER_OCTAVE * 128


def _ulp_bins(u: np.ndarray) -> np.ndarray:
    lin = u < 16
    b = np.empty(u.shape, dtype=np.int64)
    b[lin] = np.floor(u[lin] * 4).astype(np.int64)
    big = u[~lin]
    b[~lin] = _LIN_BINS + np.floor(np.log2(big / 16.0) * _LOG_PER_OCTAVE).astype(np.int64)
    return np.clip(b, 0, _NBINS - 1)


def _bin_upper(b: int) -> float:
    if b < _LIN_BINS:
        return (b + 1) / 4.0
    return 16.0 * 2.0 ** ((b - _LIN_BINS + 1) / _LOG_PER_OCTAVE)


def _widen(raw: np.ndarray, dt: DType, work: np.dtype) -> np.ndarray:
    if dt.name == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(work, copy=False)
    return raw.astype(work, copy=False)


class FloatMetrics:
    """max/mean abs, max rel, RMSE, cosine, SQNR, ULP p50/p99/max, allclose violations, NaN/Inf."""

    def __init__(self, da: DType, db: DType, unit: DType, tol: Tolerance, shape: tuple[int, ...]):
        self.da, self.db, self.unit, self.tol = da, db, unit, tol
        self.work = np.dtype(np.float64 if "float64" in (da.name, db.name) else np.float32)
        self.n = 0
        self.finite = 0
        self.nan = [0, 0]
        self.inf = [0, 0]
        self.nonfinite_mismatch = 0
        self.max_abs = 0.0
        self.worst = -1
        self.max_rel = 0.0
        self.sum_abs = 0.0
        self.sum_sq_err = 0.0
        self.sum_sq_a = 0.0
        self.sum_sq_b = 0.0
        self.dot = 0.0
        self.violations = 0
        self.min = [math.inf, math.inf]
        self.max = [-math.inf, -math.inf]
        self.ulp_max = 0.0
        self.hist = np.zeros(_NBINS, dtype=np.int64)
        self.row = int(np.prod(shape[1:])) if len(shape) >= 2 else 0
        self.rows = np.zeros(shape[0], dtype=np.float64) if len(shape) >= 2 and shape[0] <= 4_000_000 else None

    def update(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        a = _widen(ra, self.da, self.work)
        b = _widen(rb, self.db, self.work)
        self.n += a.size
        fa, fb = np.isfinite(a), np.isfinite(b)
        both = fa & fb
        if not both.all():
            na, nb = np.isnan(a), np.isnan(b)
            self.nan[0] += int(na.sum())
            self.nan[1] += int(nb.sum())
            self.inf[0] += int(np.isinf(a).sum())
            self.inf[1] += int(np.isinf(b).sum())
            same = (na & nb) | (np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b)))
            bad = ~both & ~same
            k = int(bad.sum())
            if k:
                self.nonfinite_mismatch += k
                if self.worst < 0 or math.isfinite(self.max_abs):
                    self.worst = start + int(np.argmax(bad))
                    self.max_abs = math.inf
            a, b = a[both], b[both]
            idx = np.flatnonzero(both)
        else:
            idx = None
        if a.size == 0:
            return
        self.finite += a.size
        d = np.abs(a - b)
        i = int(np.argmax(d))
        if d[i] > self.max_abs or self.worst < 0:
            if math.isfinite(self.max_abs):
                self.max_abs = float(d[i])
                self.worst = start + (int(idx[i]) if idx is not None else i)
        aa = np.abs(a)
        self.sum_abs += float(d.sum(dtype=np.float64))
        self.sum_sq_err += float(np.dot(d.astype(np.float64, copy=False), d.astype(np.float64, copy=False)))
        a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
        self.sum_sq_a += float(np.dot(a64, a64))
        self.sum_sq_b += float(np.dot(b64, b64))
        self.dot += float(np.dot(a64, b64))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = d / np.maximum(aa, np.finfo(self.work).tiny)
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.violations += int((d > self.tol.atol + self.tol.rtol * aa).sum())
        self.min[0] = min(self.min[0], float(a.min()))
        self.max[0] = max(self.max[0], float(a.max()))
        self.min[1] = min(self.min[1], float(b.min()))
        self.max[1] = max(self.max[1], float(b.max()))
        u = d / spacing(a, self.unit).astype(self.work)
        self.ulp_max = max(self.ulp_max, float(u.max()))
        self.hist += np.bincount(_ulp_bins(u), minlength=_NBINS)
        if self.rows is not None and idx is None and self.row:
            r0 = start // self.row
            if start % self.row == 0 and d.size % self.row == 0:
                m = d.reshape(-1, self.row).max(axis=1)
                self.rows[r0 : r0 + m.size] = np.maximum(self.rows[r0 : r0 + m.size], m)
            else:
                rr = (start + np.arange(d.size)) // self.row
                np.maximum.at(self.rows, rr, d)

    def _percentile(self, q: float) -> float:
        total = int(self.hist.sum())
        if total == 0:
            return 0.0
        c = np.cumsum(self.hist)
        b = int(np.searchsorted(c, math.ceil(q * total)))
        return min(_bin_upper(b), self.ulp_max) if b > 0 or self.hist[0] < total else 0.0

    def result(self) -> dict:
        na = math.sqrt(self.sum_sq_a)
        nb = math.sqrt(self.sum_sq_b)
        if na == 0 and nb == 0:
            cos = 1.0
        elif na == 0 or nb == 0:
            cos = 0.0
        else:
            cos = self.dot / (na * nb)
        sqnr = math.inf if self.sum_sq_err == 0 else (10 * math.log10(self.sum_sq_a / self.sum_sq_err) if self.sum_sq_a > 0 else -math.inf)
        f = max(self.finite, 1)
        return {
            "numel": self.n,
            "max_abs": self.max_abs,
            "mean_abs": self.sum_abs / f,
            "max_rel": self.max_rel,
            "rmse": math.sqrt(self.sum_sq_err / f),
            "cosine": cos,
            "sqnr_db": sqnr,
            "ulp_p50": self._percentile(0.5),
            "ulp_p99": self._percentile(0.99),
            "ulp_max": self.ulp_max,
            "ulp_unit": self.unit.name,
            "mismatch_fraction": (self.violations + self.nonfinite_mismatch) / max(self.n, 1),
            "mismatches": self.violations + self.nonfinite_mismatch,
            "nan": {"a": self.nan[0], "b": self.nan[1]},
            "inf": {"a": self.inf[0], "b": self.inf[1]},
            "nonfinite_mismatch": self.nonfinite_mismatch,
            "range": {"a": [self.min[0], self.max[0]], "b": [self.min[1], self.max[1]]},
        }

    def verdict(self) -> tuple[bool, str]:
        r = self.result()
        t = self.tol
        if self.nonfinite_mismatch:
            return True, f"NaN/Inf on one side only ({self.nonfinite_mismatch} elements; A nan={self.nan[0]} inf={self.inf[0]}, B nan={self.nan[1]} inf={self.inf[1]})"
        if r["mismatch_fraction"] > t.max_mismatch:
            return True, (f"{r['mismatches']} of {r['numel']} elements ({100 * r['mismatch_fraction']:.3g}%) outside "
                          f"atol={t.atol:g} rtol={t.rtol:g} (allowed {100 * t.max_mismatch:.3g}%); max abs {r['max_abs']:.4g}")
        if t.min_cosine is not None and r["cosine"] < t.min_cosine:
            return True, f"cosine {r['cosine']:.6f} < {t.min_cosine:g}"
        return False, ""


class ExactMetrics:
    """Integer and bool tensors: equal or not, with the first difference."""

    def __init__(self, da: DType, db: DType):
        self.n = 0
        self.diff = 0
        self.first = -1
        self.max_abs = 0

    def update(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        self.n += ra.size
        ne = ra.astype(np.int64) != rb.astype(np.int64)
        k = int(ne.sum())
        if k:
            if self.first < 0:
                self.first = start + int(np.argmax(ne))
            self.diff += k
            self.max_abs = max(self.max_abs, int(np.abs(ra.astype(np.int64) - rb.astype(np.int64)).max()))

    @property
    def worst(self) -> int:
        return self.first

    def result(self) -> dict:
        return {"numel": self.n, "mismatches": self.diff, "mismatch_fraction": self.diff / max(self.n, 1),
                "max_abs": self.max_abs}

    def verdict(self) -> tuple[bool, str]:
        if self.diff:
            return True, f"{self.diff} of {self.n} integer elements differ (must be equal)"
        return False, ""


class TopKSetMetrics:
    """Top-k id tensors [..., k]: rows compared as sets (order within a row is free)."""

    def __init__(self, k: int, tol: Tolerance):
        self.k = max(k, 1)
        self.tol = tol
        self.rows = 0
        self.diff_rows = 0
        self.overlap = 0
        self.first = -1

    def update(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        a = np.sort(ra.reshape(-1, self.k).astype(np.int64), axis=1)
        b = np.sort(rb.reshape(-1, self.k).astype(np.int64), axis=1)
        ne = (a != b).any(axis=1)
        self.rows += a.shape[0]
        k = int(ne.sum())
        if k and self.first < 0:
            self.first = start + int(np.argmax(ne)) * self.k
        self.diff_rows += k
        # |A ∩ B| per row: count of b's ids found in a's sorted row
        for j in range(self.k):
            col = b[:, j : j + 1]
            self.overlap += int((a == col).any(axis=1).sum())

    @property
    def worst(self) -> int:
        return self.first

    def result(self) -> dict:
        return {"rows": self.rows, "rows_differ": self.diff_rows,
                "row_agreement": 1 - self.diff_rows / max(self.rows, 1),
                "mean_overlap": self.overlap / max(self.rows * self.k, 1),
                "mismatch_fraction": self.diff_rows / max(self.rows, 1)}

    def verdict(self) -> tuple[bool, str]:
        frac = self.diff_rows / max(self.rows, 1)
        if frac > self.tol.max_mismatch:
            return True, f"{self.diff_rows} of {self.rows} rows choose a different set of ids"
        return False, ""


def widen_all(raw: np.ndarray, dt: DType) -> np.ndarray:
    return to_float64(raw, dt)
