"""Streaming metrics: each accumulator sees a tensor chunk by chunk, so memory stays bounded
whatever the tensor's size. Side A is the reference (the oracle); B the candidate.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tensordiff.format.dtypes import DType, to_float64
from tensordiff.judge.tolerance import Tolerance
from tensordiff.judge.native import float_cuts, float_kernel

# ULP histogram: quarter-ULP bins below 16 ULP, then 16 bins per octave (~4.4% wide).
_LIN_BINS = 64
_LOG_PER_OCTAVE = 16
_NBINS = _LIN_BINS + _LOG_PER_OCTAVE * 128
# A ULP distance u (float32) is binned through the top 16 bits of its bit pattern (`_KEY_SHIFT`):
# one table lookup instead of a log2 per element. Below 16 ULP a key cell (at most 1/16 ULP
# wide) lies inside one quarter-ULP bin, so those bins are exact; above, a cell (2**-7 relative)
# takes the log bin of its lower edge, and `_UPPER` is the true upper edge of each bin's cells,
# so a percentile read from the histogram is still an upper bound.
_KEY_SHIFT = 16
_NKEYS = 1 << (31 - _KEY_SHIFT)
_F32_EXP = 0x7F800000
_F64_EXP = 0x7FF0000000000000
_MIN_EXP = {"float64": -1022, "float32": -126, "float16": -14, "bfloat16": -126}
_NUMPY_STEP = 1 << 18  # the numpy path's work arrays stay cache-sized whatever the chunk


class MetricResult(Mapping):
    """A tensor's metrics, typed. `as_json()` is the report's dict (keys stable); the same keys
    read as a mapping (`m["max_abs"]`), so a report or script written against the dict form works."""

    def as_json(self) -> dict:
        raise NotImplementedError

    def __getitem__(self, key: str):
        return self.as_json()[key]

    def __iter__(self):
        return iter(self.as_json())

    def __len__(self) -> int:
        return len(self.as_json())


@dataclass(frozen=True, eq=False)
class FloatResult(MetricResult):
    numel: int
    max_abs: float  # inf when NaN/Inf appear on one side only
    mean_abs: float
    max_rel: float
    rmse: float
    cosine: float
    sqnr_db: float
    ulp_p50: float
    ulp_p99: float
    ulp_max: float
    ulp_unit: str  # the dtype whose spacing a ULP is
    mismatch_fraction: float
    mismatches: int  # elements outside atol + rtol*|a|, plus one-sided NaN/Inf
    nan: tuple[int, int]  # (A, B)
    inf: tuple[int, int]
    nonfinite_mismatch: int
    range: tuple[tuple[float, float], tuple[float, float]]  # ((min A, max A), (min B, max B))
    finite_pairs: int = 0  # elements finite on both sides: all the other metrics see
    finite_max_abs: float = 0.0  # max |a - b| over those pairs (max_abs is inf beside a one-sided NaN/Inf)

    def as_json(self) -> dict:
        return {"numel": self.numel, "max_abs": self.max_abs, "mean_abs": self.mean_abs, "max_rel": self.max_rel,
                "rmse": self.rmse, "cosine": self.cosine, "sqnr_db": self.sqnr_db, "ulp_p50": self.ulp_p50,
                "ulp_p99": self.ulp_p99, "ulp_max": self.ulp_max, "ulp_unit": self.ulp_unit,
                "mismatch_fraction": self.mismatch_fraction, "mismatches": self.mismatches,
                "nan": {"a": self.nan[0], "b": self.nan[1]}, "inf": {"a": self.inf[0], "b": self.inf[1]},
                "nonfinite_mismatch": self.nonfinite_mismatch,
                "range": {"a": list(self.range[0]), "b": list(self.range[1])},
                "finite_pairs": self.finite_pairs, "finite_max_abs": self.finite_max_abs}


@dataclass(frozen=True, eq=False)
class ExactResult(MetricResult):
    numel: int
    mismatches: int
    mismatch_fraction: float
    max_abs: int

    def as_json(self) -> dict:
        return {"numel": self.numel, "mismatches": self.mismatches, "mismatch_fraction": self.mismatch_fraction,
                "max_abs": self.max_abs}


@dataclass(frozen=True, eq=False)
class TopKResult(MetricResult):
    rows: int
    rows_differ: int
    row_agreement: float
    mean_overlap: float
    mismatch_fraction: float
    ties: dict | None = None  # the tie rule's verdict on the differing rows (`tensordiff.judge.ties`)

    def as_json(self) -> dict:
        out = {"rows": self.rows, "rows_differ": self.rows_differ, "row_agreement": self.row_agreement,
               "mean_overlap": self.mean_overlap, "mismatch_fraction": self.mismatch_fraction}
        if self.ties is not None:
            out["ties"] = self.ties
        return out


def _ulp_bins(u: np.ndarray) -> np.ndarray:
    lin = u < 16
    b = np.empty(u.shape, dtype=np.int64)
    b[lin] = np.floor(u[lin] * 4).astype(np.int64)
    big = u[~lin]
    b[~lin] = _LIN_BINS + np.floor(np.log2(big / 16.0) * _LOG_PER_OCTAVE).astype(np.int64)
    return np.clip(b, 0, _NBINS - 1)


def _key_table() -> tuple[np.ndarray, np.ndarray]:
    keys = np.arange(1 << (32 - _KEY_SHIFT - 1), dtype=np.uint32)  # sign bit clear: u >= 0
    with np.errstate(invalid="ignore"):  # the top keys are Inf/NaN patterns
        lower = (keys << _KEY_SHIFT).view(np.float32).astype(np.float64)
        upper = ((keys + 1) << _KEY_SHIFT).view(np.float32).astype(np.float64)
    finite = np.isfinite(lower)
    lut = np.full(keys.size, _NBINS - 1, dtype=np.int64)
    lut[finite] = _ulp_bins(lower[finite])
    up = np.array([(b + 1) / 4.0 if b < _LIN_BINS else 16.0 * 2.0 ** ((b - _LIN_BINS + 1) / _LOG_PER_OCTAVE)
                   for b in range(_NBINS)])
    log = finite & (lut >= _LIN_BINS)
    top = np.zeros(_NBINS)
    np.maximum.at(top, lut[log], upper[log])
    up[_LIN_BINS:] = np.where(top[_LIN_BINS:] > 0, top[_LIN_BINS:], up[_LIN_BINS:])
    return lut.astype(np.int16), up


_LUT, _UPPER = _key_table()


def _kernel_bins(u: np.ndarray) -> np.ndarray:
    """The native kernel's bin of float32 ULP distances u >= 0 (native/float_metrics.c `bin_of`),
    from u's bits alone: below 16, floor(4u); Inf, the last bin; otherwise 64 + 16 per octave above
    16 + floor(16 log2 v) for v = 1.m (u's top 7 mantissa bits), taken as the exponent of v^16 by
    four float32 squarings. The same float32 arithmetic as the kernel's."""
    b = u.view(np.uint32)
    e = (b >> 23).astype(np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        lin = (np.where(u < 16, u, np.float32(0)) * np.float32(4)).astype(np.int64)
        v = ((b & 0x007F0000) | 0x3F800000).view(np.float32)
        for _ in range(4):
            v = v * v
    lg = _LIN_BINS + (e - 131) * 16 + ((v.view(np.uint32) >> 23).astype(np.int64) - 127)
    return np.where(u < 16, lin, np.where(e >= 255, _NBINS - 1, lg))


# The kernel counts bins, not keys: its formula must give `_LUT`'s bin for every key (each key's
# lower edge stands for its cell: the formula reads only the bits a key keeps).
with np.errstate(invalid="ignore"):
    _edges = (np.arange(_NKEYS, dtype=np.uint32) << _KEY_SHIFT).view(np.float32)
if not np.array_equal(_kernel_bins(_edges), _LUT):
    raise AssertionError("metrics: the native kernel's ULP bin formula no longer matches the key table")
del _edges


def _bin_upper(b: int) -> float:
    return float(_UPPER[b])


_UPPER_LIST = _UPPER.tolist()  # each bin's upper edge as a Python float (read once per tensor)


def _widen(raw: np.ndarray, dt: DType, work: np.dtype, out: np.ndarray) -> np.ndarray:
    """Stored elements as `work` floats; `out` is used when a conversion is needed."""
    if dt.name == "bfloat16":
        bits = np.left_shift(raw, 16, dtype=np.uint32, out=out.view(np.uint32)[: raw.size]) if work == np.float32 \
            else np.left_shift(raw.astype(np.uint32), 16)
        return bits.view(np.float32).astype(work, copy=False)
    if raw.dtype == work:
        return raw
    out = out[: raw.size]
    np.copyto(out, raw)
    return out


# Counters (FloatMetrics.I) and float accumulators (FloatMetrics.D), shared with the native
# kernel's layout (native/float_metrics.c).
_N, _FINITE, _NAN_A, _NAN_B, _INF_A, _INF_B, MISMATCH, _VIOL, WORST, FIRST_BAD = range(10)
_MAX_ABS, _MAX_REL, _SUM_ABS, _SUM_SQ_ERR, _SUM_SQ_A, _SUM_SQ_B, _UNUSED, _MIN_A, _MAX_A, _MIN_B, _MAX_B, _ULP_MAX = range(12)


def _aligned(x: np.ndarray) -> np.ndarray:
    """x as C-contiguous aligned elements (np.require checks the same in ~10 us; flags in ~0.3)."""
    f = x.flags
    return x if f.c_contiguous and f.aligned else np.require(x, requirements="CA")


def _data(x: np.ndarray) -> int:
    """The address of an array's first element (cheaper than `x.ctypes.data`)."""
    return x.__array_interface__["data"][0]


# A tensor of at least CUT_MIN elements counts its ULP bins in full only until a first chunk has
# located its percentiles; the rest of it counts, per percentile, the pairs below a few bin edges
# around that first estimate (the native kernel's cut mode: two vector ops an edge, where a bin is a
# scalar increment an element; counting every chunk's histogram made the kernel 1.2x slower on the
# bench's dumps, bench/compare_throughput.py's kernel_fullhist route). Those counts give a
# percentile's bin exactly when it lies between two counted edges one bin apart; when the rest of
# the tensor moved it further, `exact_percentiles()` says so and the caller measures the tensor again
# with the full histogram (judge.py). So the bins are the histogram's, always.
CUT_MIN = 4 << 20
MAX_CUTS = 8   # the kernel's most edges a call (native/float_metrics.c MAXCUTS)


def _cuts_around(hist: np.ndarray, qs: tuple[float, ...]) -> np.ndarray | None:
    """The bin edges to count for the rest of a tensor: for each percentile's bin b in `hist` (a
    first chunk's), the edges of b and of its neighbour on the side the percentile leans to inside
    b (b - 1 when it lies in the lower half of b's count, else b + 1): three edges (edge e counts
    bins below e), within 1 .. _NBINS - 1 (edge 0 counts nothing, edge _NBINS everything: both
    known). Three, not four (b - 1 .. b + 1): 6% less kernel CPU time on the bench's dumps."""
    c = np.cumsum(hist)
    total = int(c[-1])
    if total == 0:
        return None
    edges: set[int] = set()
    for q in qs:
        t = math.ceil(q * total)
        b = int(np.searchsorted(c, t))
        low = (t - (c[b - 1] if b else 0)) * 2 <= hist[b]  # in the lower half of its bin's count
        edges.update(e for e in ((b - 1, b, b + 1) if low else (b, b + 1, b + 2)) if 1 <= e < _NBINS)
    cuts = np.array(sorted(edges), dtype=np.int32)
    return cuts if 0 < cuts.size <= MAX_CUTS else None


class _Shared:
    """What sibling accumulators (one per worker thread) share: the row maxima, and the bin edges
    a large tensor counts once a first chunk has located its percentiles (`CUT_MIN`)."""

    def __init__(self, shape: tuple[int, ...]):
        self.row = math.prod(shape[1:]) if len(shape) >= 2 else 0
        self.rows = np.zeros(shape[0], dtype=np.float64) if len(shape) >= 2 and shape[0] <= 4_000_000 else None
        self.lock = threading.Lock()
        self.n = math.prod(shape)
        self._rows_ptr = 0
        # (edges, their address) once a first chunk decided them, set in one assignment (a sibling
        # reads it unlocked); `decided` stays True when that chunk found none to count (all NaN)
        self.cuts: tuple[np.ndarray, int] | None = None
        self.decided = False

    def decide_cuts(self, hist: np.ndarray) -> None:
        with self.lock:
            if not self.decided:
                cuts = _cuts_around(hist, PERCENTILES)
                self.cuts = (cuts, _data(cuts)) if cuts is not None else None
                self.decided = True

    def rows_ptr(self) -> int:
        if not self._rows_ptr:
            self._rows_ptr = _data(self.rows)
        return self._rows_ptr

    def update_rows(self, start: int, d: np.ndarray) -> None:
        """Max of d (|a-b| at flat positions start.., 0 where not finite) into each row."""
        if self.rows is None or not self.row or d.size == 0:
            return
        r0, r1 = start // self.row, (start + d.size - 1) // self.row + 1
        head = r0 * self.row
        if start == head and d.size % self.row == 0:
            m = d.reshape(-1, self.row).max(axis=1)
        else:
            m = np.maximum.reduceat(d, np.maximum(np.arange(r0, r1) * self.row - start, 0))
        self.merge_rows(r0, m)

    def merge_rows(self, r0: int, m: np.ndarray) -> None:
        with self.lock:
            seg = self.rows[r0 : r0 + m.size]
            np.maximum(seg, m, out=seg)


# A fresh accumulator's counters and float accumulators (copied: cheaper than building them)
_I0 = np.zeros(10, dtype=np.int64)
_I0[[WORST, FIRST_BAD]] = -1
_D0 = np.array([-1.0, 0, 0, 0, 0, 0, 0, math.inf, -math.inf, math.inf, -math.inf, 0])
STORE0 = np.concatenate([_I0, _D0.view(np.int64), np.zeros(_NBINS, dtype=np.int64)])
_CONSTANTS: dict = {}


def constants(work: np.dtype, unit: DType) -> tuple:
    """(floor bits, exponent mask, bit type, floor as float32, ULP scale, tiny) of a work dtype
    and unit, computed once per pair (a comparison of thousands of tensors builds thousands of
    accumulators)."""
    key = (work, unit.name)
    c = _CONSTANTS.get(key)
    if c is None:
        if work == np.float32:
            fb = np.uint32((_MIN_EXP[unit.name] + 127) << 23)
            c = (fb, np.uint32(_F32_EXP), np.uint32, float(np.array(fb, dtype=np.uint32).view(np.float32)[()]))
        else:
            c = (np.uint64((_MIN_EXP[unit.name] + 1023) << 52), np.uint64(_F64_EXP), np.uint64, None)
        c = _CONSTANTS[key] = c + (work.type(2.0 ** -unit.bits_mantissa), np.finfo(work).tiny)
    return c


class FloatMetrics:
    """max/mean abs, max rel, RMSE, cosine, SQNR, ULP p50/p99/max, allclose violations, NaN/Inf.

    Float32 and bfloat16 inputs are compared in float32 (bf16 widens exactly), anything with a
    float64 side in float64. Sums are accumulated in float64 (the native kernel adds float
    partial sums of 1024-element blocks: ~1e-7 relative), and the cosine is taken from them as
    1 - (|a-b|^2 - (|a| - |b|)^2) / (2 |a| |b|), exact where it matters, near 1. Per element:
    d = |a - b|; rel = d / max(|a|, tiny); a violation is d > atol + rtol * |a|; the ULP distance
    is d / spacing(a) with spacing(a) = 2**(max(exponent(a), min normal exponent) - mantissa bits)
    in the narrower dtype (`unit`). NaN/Inf pairs are counted per side and are a mismatch unless
    both sides hold NaN or the same infinity; the other metrics see finite pairs only.

    One instance per worker thread: `spawn()` makes a sibling sharing the row maxima, `merge()`
    folds a sibling's totals in. The native kernel (tensordiff.judge.native) computes the same
    arithmetic in one pass when it is available and both sides are float32/bfloat16.
    """

    def __init__(self, da: DType, db: DType, unit: DType, tol: Tolerance, shape: tuple[int, ...],
                 _shared: _Shared | None = None, *, full_histogram: bool = False):
        self.da, self.db, self.unit, self.tol, self.shape = da, db, unit, tol, shape
        self.work = np.dtype(np.float64 if "float64" in (da.name, db.name) else np.float32)
        self.shared = _shared or _Shared(shape)
        # counters, float accumulators and bins in one buffer: one copy of a template and one
        # address for the native kernel, instead of three arrays per accumulator (per small tensor)
        self._store = STORE0.copy()
        self.I, self.D, self.hist = self._store[:10], self._store[10:22].view(np.float64), self._store[22:]
        self._result: FloatResult | None = None  # result() once per state (verdict() reads it too)
        self._bufs: dict[str, np.ndarray] = {}
        (self._floor_bits, self._mask, self._ibits, self._floor_f32, self._scale,
         self._tiny) = constants(self.work, unit)
        # a magnitude-aware atol arrives measured (`Tolerance.scale`): the element rule sees its value
        self._atol, self._rtol = self.work.type(tol.effective_atol), self.work.type(tol.rtol)
        self._native = None
        self._ptrs: tuple | None = None
        # cut mode (CUT_MIN): counts of the pairs below each of shared.cuts' edges, and how many
        # pairs were counted so (the rest went to `hist`)
        self.full_histogram = full_histogram
        self._below = np.zeros(MAX_CUTS, dtype=np.int64)
        self._cut_pairs = 0
        self._cut_fn = None
        if {da.name, db.name} <= {"float32", "bfloat16"}:
            self._native = float_kernel()
            if not full_histogram and self.shared.n >= CUT_MIN:
                self._cut_fn = float_cuts()

    def spawn(self) -> "FloatMetrics":
        return FloatMetrics(self.da, self.db, self.unit, self.tol, self.shape, self.shared,
                            full_histogram=self.full_histogram)

    def again(self) -> "FloatMetrics":
        """A fresh accumulator for the same pair that counts the whole histogram: for measuring the
        tensor again when its cut counts could not settle a percentile (`exact_percentiles`)."""
        return FloatMetrics(self.da, self.db, self.unit, self.tol, self.shape, full_histogram=True)

    @property
    def rows(self) -> np.ndarray | None:
        return self.shared.rows

    @property
    def row(self) -> int:
        return self.shared.row

    @property
    def worst(self) -> int:
        return int(self.I[FIRST_BAD] if self.I[MISMATCH] else self.I[WORST])

    @property
    def max_abs(self) -> float:
        if self.I[MISMATCH]:
            return math.inf
        return float(self.D[_MAX_ABS]) if self.I[WORST] >= 0 else 0.0

    # ------------------------------------------------------------------ updates

    def update(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        if ra.size == 0:
            return
        self._result = None
        if self._native is not None:
            # the kernel needs C-contiguous, aligned elements (a foreign writer may misalign data)
            self._update_native(start, _aligned(ra), _aligned(rb))
        else:
            with np.errstate(all="ignore"):  # Inf - Inf, overflowing quotients: counted, not warned
                for s in range(0, ra.size, _NUMPY_STEP):
                    self._update_numpy(start + s, ra[s : s + _NUMPY_STEP], rb[s : s + _NUMPY_STEP])

    def _update_native(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        row, rows, r0, rbuf = self.row, None, 0, None
        if self.rows is not None and row and start == 0 and ra.size == self.shared.n:
            rows = self.shared.rows_ptr()  # the whole tensor in one call (no sibling at work): in place
        elif self.rows is not None and row:
            r0 = start // row
            rbuf = np.zeros((start + ra.size - 1) // row + 1 - r0)
            rows = _data(rbuf)
        if self._ptrs is None:  # this accumulator's own arrays do not move: their addresses once
            self._ptrs = (int(self.da.name == "bfloat16"), int(self.db.name == "bfloat16"), self.tol.effective_atol,
                          self.tol.rtol, self._floor_f32, float(self._scale))
            base = _data(self._store)
            self._ptrs += (base + 22 * 8, base, base + 10 * 8)  # hist, I, D inside the one buffer
        ka, kb, atol, rtol, fl, sc, h, pi, pd = self._ptrs
        sh = self.shared
        cuts = sh.cuts
        if self._cut_fn is not None and cuts is not None:
            finite = int(self.I[_FINITE])
            rc = self._cut_fn(_data(ra), ka, _data(rb), kb, ra.size, start, atol, rtol, fl, sc, _NBINS, rows, row, r0,
                              pi, pd, cuts[1], cuts[0].size, _data(self._below))
            self._cut_pairs += int(self.I[_FINITE]) - finite
        else:
            rc = self._native(_data(ra), ka, _data(rb), kb, ra.size, start, atol, rtol, fl, sc, h, _NBINS, rows, row,
                              r0, pi, pd)
            if self._cut_fn is not None and not sh.decided:
                sh.decide_cuts(self.hist)
        if rc:
            raise RuntimeError(f"native float kernel failed ({rc})")
        if rbuf is not None:
            self.shared.merge_rows(r0, rbuf)

    def _buf(self, name: str, n: int, dtype) -> np.ndarray:
        b = self._bufs.get(name)
        if b is None or b.size < n or b.dtype != dtype:
            b = self._bufs[name] = np.empty(max(n, 1), dtype=dtype)
        return b[:n]

    def _update_numpy(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        n = ra.size
        a = _widen(ra, self.da, self.work, self._buf("a", n, self.work))
        b = _widen(rb, self.db, self.work, self._buf("b", n, self.work))
        self.I[_N] += n
        d = np.subtract(a, b, out=self._buf("d", n, self.work))
        np.abs(d, out=d)
        i = int(np.argmax(d))
        idx = None
        if not math.isfinite(d[i]):  # NaN/Inf somewhere (or an overflowing difference)
            fa, fb = np.isfinite(a), np.isfinite(b)
            both = fa & fb
            if not both.all():
                na, nb = np.isnan(a), np.isnan(b)
                ia, ib = np.isinf(a), np.isinf(b)
                self.I[_NAN_A] += int(na.sum())
                self.I[_NAN_B] += int(nb.sum())
                self.I[_INF_A] += int(ia.sum())
                self.I[_INF_B] += int(ib.sum())
                same = (na & nb) | (ia & ib & (np.signbit(a) == np.signbit(b)))
                bad = ~both & ~same
                k = int(bad.sum())
                if k:
                    self.I[MISMATCH] += k
                    if self.I[FIRST_BAD] < 0:
                        self.I[FIRST_BAD] = start + int(np.argmax(bad))
                idx = np.flatnonzero(both)
                a, b, d = a[idx], b[idx], d[idx]
                if d.size == 0:
                    return
                i = int(np.argmax(d))
        self._finite(start, a, b, d, i, idx)
        if idx is None:
            self.shared.update_rows(start, d)
        elif self.rows is not None:
            full = np.zeros(n, dtype=self.work)
            full[idx] = d
            self.shared.update_rows(start, full)

    def _finite(self, start: int, a: np.ndarray, b: np.ndarray, d: np.ndarray, i: int, idx) -> None:
        I, D, k, w = self.I, self.D, d.size, self.work
        I[_FINITE] += k
        m = float(d[i])
        if m > D[_MAX_ABS] or I[WORST] < 0:
            D[_MAX_ABS] = m
            I[WORST] = start + (int(idx[i]) if idx is not None else i)
        D[_SUM_ABS] += float(np.add.reduce(d, dtype=np.float64))
        t64 = self._buf("t64", k, np.float64)
        for slot, x in ((_SUM_SQ_ERR, d), (_SUM_SQ_A, a), (_SUM_SQ_B, b)):
            np.multiply(x, x, out=t64, dtype=np.float64)  # exact: float32 squares fit a double
            D[slot] += float(np.add.reduce(t64))
        aa = np.abs(a, out=self._buf("aa", k, w))
        r = np.maximum(aa, self._tiny, out=self._buf("r", k, w))
        np.divide(d, r, out=r)
        mr = float(r.max())
        D[_MAX_REL] = max(D[_MAX_REL], mr)
        # No element can violate when every d <= atol, or (with margin for rounding) every
        # d/|a| < rtol; otherwise count d > atol + rtol*|a| in the work precision.
        if not (m <= self._atol or (self._atol >= 2.0 ** -90 and mr <= self._rtol * (1 - 2.0 ** -20))):
            np.multiply(aa, self._rtol, out=r)
            np.add(r, self._atol, out=r)
            I[_VIOL] += int(np.count_nonzero(np.greater(d, r, out=self._buf("m", k, np.bool_))))
        D[_MIN_A] = min(D[_MIN_A], float(a.min()))
        D[_MAX_A] = max(D[_MAX_A], float(a.max()))
        D[_MIN_B] = min(D[_MIN_B], float(b.min()))
        D[_MAX_B] = max(D[_MAX_B], float(b.max()))
        # ULP distance: spacing(a) from a's exponent bits, floored at the minimum normal exponent
        sb = np.bitwise_and(a.view(self._ibits), self._mask, out=self._buf("sp", k, self._ibits))
        np.maximum(sb, self._floor_bits, out=sb)
        sp = sb.view(w)
        np.multiply(sp, self._scale, out=sp)
        u = np.divide(d, sp, out=sp)
        D[_ULP_MAX] = max(D[_ULP_MAX], float(u.max()))
        u32 = u if w == np.float32 else u.astype(np.float32)
        key = np.right_shift(u32.view(np.uint32), _KEY_SHIFT, out=self._buf("key", k, np.uint32))
        self.hist += np.bincount(np.take(_LUT, key), minlength=_NBINS)

    def merge(self, other: "FloatMetrics") -> None:
        self._result = None
        I, D, oI, oD = self.I, self.D, other.I, other.D
        I[:WORST] += oI[:WORST]
        if oI[WORST] >= 0 and (I[WORST] < 0 or oD[_MAX_ABS] > D[_MAX_ABS]
                                or (oD[_MAX_ABS] == D[_MAX_ABS] and oI[WORST] < I[WORST])):
            D[_MAX_ABS], I[WORST] = oD[_MAX_ABS], oI[WORST]
        if oI[FIRST_BAD] >= 0 and (I[FIRST_BAD] < 0 or oI[FIRST_BAD] < I[FIRST_BAD]):
            I[FIRST_BAD] = oI[FIRST_BAD]
        D[_SUM_ABS:_SUM_SQ_B + 1] += oD[_SUM_ABS:_SUM_SQ_B + 1]
        for j in (_MAX_REL, _MAX_A, _MAX_B, _ULP_MAX):
            D[j] = max(D[j], oD[j])
        for j in (_MIN_A, _MIN_B):
            D[j] = min(D[j], oD[j])
        self.hist += other.hist
        self._below += other._below
        self._cut_pairs += other._cut_pairs

    # ------------------------------------------------------------------ results

    def _percentile_bins(self, hist: np.ndarray, qs: tuple[float, ...]) -> list[int]:
        """The bin of each percentile (the first whose cumulative count reaches ceil(q total)), -1
        where it is 0; the native batch (td_float_batch) finds the same bins in C."""
        c = np.cumsum(hist)
        total = int(c[-1])
        if total == 0:
            return [-1] * len(qs)
        bs = np.searchsorted(c, [math.ceil(q * total) for q in qs]).tolist()
        return [b if b > 0 or hist[0] < total else -1 for b in bs]

    def _cut_percentile_bins(self, qs: tuple[float, ...]) -> list[int] | None:
        """The percentiles' bins from `hist` (the chunks counted in full) and the cut counts (the
        rest): count(bin < e) is known exactly at e = 0, at every cut edge and at _NBINS, so a
        percentile's bin b is known when edges b and b + 1 both are (the first bin whose
        cumulative count reaches ceil(q total)); None when some percentile's is not."""
        c = np.concatenate([[0], np.cumsum(self.hist)])  # c[e]: full-histogram pairs below edge e
        total = int(c[-1]) + self._cut_pairs
        if total == 0:
            return [-1] * len(qs)
        known = {0: 0, _NBINS: total}
        for k, e in enumerate(self.shared.cuts[0].tolist()):
            known[e] = int(c[e]) + int(self._below[k])
        out = []
        for q in qs:
            target = math.ceil(q * total)
            b = next((e for e in sorted(known) if e + 1 in known and known[e] < target <= known[e + 1]), None)
            if b is None:
                return None
            out.append(-1 if b == 0 and known[1] == total else b)
        return out

    def exact_percentiles(self) -> bool:
        """False when the cut counts cannot settle a percentile (the tensor's later chunks moved it
        away from where its first chunk put it): measure it again with `again()`."""
        return self._cut_pairs == 0 or self._cut_percentile_bins(PERCENTILES) is not None

    def result(self) -> FloatResult:
        if self._result is None:
            I, D = self.I.tolist(), self.D.tolist()  # Python numbers: ~30 reads, each cheap
            bins = self._cut_percentile_bins(PERCENTILES) if self._cut_pairs else self._percentile_bins(self.hist, PERCENTILES)
            if bins is None:
                raise RuntimeError("the cut counts do not settle a percentile: measure again with again()")
            self._result = float_result(I, D, bins, self.unit.name)
        return self._result

    def verdict(self) -> tuple[bool, str]:
        return float_verdict(self.result(), self.tol, self.I.tolist())


PERCENTILES = (0.5, 0.99)  # ulp_p50, ulp_p99


def float_result(I: list, D: list, pct_bins: list[int], unit: str) -> FloatResult:
    """A tensor's FloatResult from its counters I and accumulators D (FloatMetrics' layout, as
    Python numbers) and the bins of its PERCENTILES (-1: 0). The streamed accumulator and the
    native batch of small tensors (tensordiff/judge/batch.py) both report through this."""
    sum_sq_a, sum_sq_b, sum_sq_err = float(D[_SUM_SQ_A]), float(D[_SUM_SQ_B]), float(D[_SUM_SQ_ERR])
    na, nb = math.sqrt(sum_sq_a), math.sqrt(sum_sq_b)
    if na == 0 and nb == 0:
        cos = 1.0
    elif na == 0 or nb == 0:
        cos = 0.0
    else:
        # |a-b|^2 = |a|^2 + |b|^2 - 2 a.b, written so that 1 - cos comes from the small
        # quantities: accurate near cos = 1 (where it matters) even from float partial sums
        cos = max(-1.0, min(1.0, 1.0 - (sum_sq_err - (na - nb) ** 2) / (2 * na * nb)))
    # a difference that overflows float32 makes sum_sq_err inf: the ratio is then 0 (-inf dB)
    ratio = sum_sq_a / sum_sq_err if sum_sq_err else math.inf
    sqnr = 10 * math.log10(ratio) if ratio > 0 else (-math.inf if ratio == 0 else math.nan)
    f = max(int(I[_FINITE]), 1)
    n = int(I[_N])
    bad = int(I[_VIOL] + I[MISMATCH])
    ulp_max = float(D[_ULP_MAX])
    p50, p99 = (min(_UPPER_LIST[b], ulp_max) if b >= 0 else 0.0 for b in pct_bins)
    finite_max = float(D[_MAX_ABS]) if I[WORST] >= 0 else 0.0
    max_abs = math.inf if I[MISMATCH] else finite_max
    return FloatResult(
        numel=n, max_abs=max_abs, mean_abs=float(D[_SUM_ABS]) / f, max_rel=float(D[_MAX_REL]),
        rmse=math.sqrt(sum_sq_err / f), cosine=cos, sqnr_db=sqnr, ulp_p50=p50,
        ulp_p99=p99, ulp_max=ulp_max, ulp_unit=unit,
        mismatch_fraction=bad / max(n, 1), mismatches=bad, nan=(int(I[_NAN_A]), int(I[_NAN_B])),
        inf=(int(I[_INF_A]), int(I[_INF_B])), nonfinite_mismatch=int(I[MISMATCH]),
        range=((float(D[_MIN_A]), float(D[_MAX_A])), (float(D[_MIN_B]), float(D[_MAX_B]))),
        finite_pairs=int(I[_FINITE]), finite_max_abs=finite_max)


def float_verdict(r: FloatResult, t: Tolerance, I: list) -> tuple[bool, str]:
    """Material or not, and why, from a FloatResult, its tolerance and its counters I."""
    if I[MISMATCH]:
        return True, (f"NaN/Inf on one side only ({I[MISMATCH]} elements; A nan={I[_NAN_A]} inf={I[_INF_A]}, "
                      f"B nan={I[_NAN_B]} inf={I[_INF_B]})")
    if I[_N] and not I[_FINITE]:
        # NaN or the same infinity everywhere on both sides: nothing was compared, so nothing passed
        return True, (f"no finite element on either side ({I[_N]} elements; A nan={I[_NAN_A]} inf={I[_INF_A]}, "
                      f"B nan={I[_NAN_B]} inf={I[_INF_B]}): nothing to compare (a tensor meant to hold no "
                      "finite value is compared with mode \"exact\")")
    if r.mismatch_fraction > t.max_mismatch:
        return True, (f"{r.mismatches} of {r.numel} elements ({100 * r.mismatch_fraction:.3g}%) outside "
                      f"atol={t.atol_text()} rtol={t.rtol:g} (allowed {100 * t.max_mismatch:.3g}%); max abs {r.max_abs:.4g}")
    if t.min_cosine is not None and r.cosine < t.min_cosine:
        return True, f"cosine {r.cosine:.6f} < {t.min_cosine:g}"
    return False, ""


class ExactMetrics:
    """Integer and bool tensors: equal or not, with the first difference."""

    def __init__(self, da: DType, db: DType):
        self.da, self.db = da, db
        self.n = 0
        self.diff = 0
        self.first = -1
        self.max_abs = 0

    def update(self, start: int, ra: np.ndarray, rb: np.ndarray) -> None:
        self.n += ra.size
        if self.da.is_float:  # a float tensor in "exact" mode: its values (raw storage would be
            # truncated by an integer cast, or be bf16 bits beside f32 values), NaN equal to NaN
            a, b = to_float64(ra, self.da), to_float64(rb, self.db)
            ne = (a != b) & ~(np.isnan(a) & np.isnan(b))
            if ne.any():
                d = np.abs(a[ne] - b[ne])
                self.max_abs = max(self.max_abs, float(np.nanmax(d)) if np.isfinite(d).any() else math.inf)
        else:
            ne = ra.astype(np.int64) != rb.astype(np.int64)
        k = int(ne.sum())
        if k:
            if self.first < 0:
                self.first = start + int(np.argmax(ne))
            self.diff += k
            if not self.da.is_float:
                self.max_abs = max(self.max_abs, int(np.abs(ra.astype(np.int64) - rb.astype(np.int64)).max()))

    def spawn(self) -> "ExactMetrics":
        return ExactMetrics(self.da, self.db)

    def merge(self, o: "ExactMetrics") -> None:
        self.n += o.n
        self.diff += o.diff
        self.max_abs = max(self.max_abs, o.max_abs)
        if o.first >= 0 and (self.first < 0 or o.first < self.first):
            self.first = o.first

    @property
    def worst(self) -> int:
        return self.first

    def result(self) -> ExactResult:
        return ExactResult(numel=self.n, mismatches=self.diff, mismatch_fraction=self.diff / max(self.n, 1),
                           max_abs=self.max_abs)

    def verdict(self) -> tuple[bool, str]:
        if self.diff:
            kind = "" if self.da.is_float else "integer "
            return True, f"{self.diff} of {self.n} {kind}elements differ (must be equal)"
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

    def spawn(self) -> "TopKSetMetrics":
        return TopKSetMetrics(self.k, self.tol)

    def merge(self, o: "TopKSetMetrics") -> None:
        self.rows += o.rows
        self.diff_rows += o.diff_rows
        self.overlap += o.overlap
        if o.first >= 0 and (self.first < 0 or o.first < self.first):
            self.first = o.first

    @property
    def worst(self) -> int:
        return self.first

    def result(self) -> TopKResult:
        return TopKResult(rows=self.rows, rows_differ=self.diff_rows, row_agreement=1 - self.diff_rows / max(self.rows, 1),
                          mean_overlap=self.overlap / max(self.rows * self.k, 1),
                          mismatch_fraction=self.diff_rows / max(self.rows, 1))

    def verdict(self) -> tuple[bool, str]:
        frac = self.diff_rows / max(self.rows, 1)
        if frac > self.tol.max_mismatch:
            return True, f"{self.diff_rows} of {self.rows} rows choose a different set of ids"
        return False, ""
