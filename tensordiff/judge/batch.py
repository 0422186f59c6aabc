"""Many small float tensors of a comparison measured in one native call.

A 40-layer model's per-layer boundaries over decode steps make thousands of small tensors, and
there the cost was around the kernel, not in it: per tensor a reader and a view per side, an
accumulator (a 17 kB buffer copied from its template), a ctypes call converting 17 arguments, the
histogram folded and searched in numpy. Here the judge gathers the small float32/bfloat16 pairs
of a boundary (their addresses inside the shared file mappings: no reader, no view), and
`td_float_batch` runs each through the same per-tensor kernel routine (`td_float_update`) in one
call, finding each histogram's percentile bins beside it (`FloatMetrics._percentile_bins` in C).
Each tensor is then reported through `metrics.float_result` and `float_verdict`, as a streamed
tensor is: the same numbers, exactly (tests/tensordiff/test_batch.py compares every field).

    batch = SmallBatch()
    if batch.add(sa, sb, tol, unit, shape):      # False: not eligible, stream it instead
        ...
    for I, D, pct_bins, rows, (va, vb) in batch.run():  # in the order added; the batch is empty after
        ...
"""
from __future__ import annotations

import math

import numpy as np

from tensordiff.format.dtypes import DType
from tensordiff.judge.metrics import STORE0, PERCENTILES, constants
from tensordiff.judge.native import (  # the module only (the kernel is built or loaded on first use): every
    float_batch,
)
# comparison asks for it, so it is imported with the comparator, not inside the first one
from tensordiff.format.storage import HDF5_EXT, StoredTensor, current_scope, mapped_address, release_bytes
from tensordiff.judge.tolerance import Tolerance

SMALL = 1 << 16  # elements per side at most: above, per-call costs are noise beside the work, and
# a large tensor is better streamed in chunks over the worker threads
BATCH_BYTES = 8 << 20  # a batch is run once it holds this many bytes per side: resident memory stays
# bounded (its pages are released after it, like a streamed chunk's) and results come in steps
_KINDS = {"float32": 0, "bfloat16": 1}  # the kernel's kinds
_ITEMSIZE = (4, 2)
_F32 = np.dtype(np.float32)
_QS = np.array(PERCENTILES, dtype=np.float64)
_OUT = 26  # int64 slots per tensor out of td_float_batch: I, D, the worst element's values, percentile bins


def _data(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


_QS_PTR = _data(_QS)


class SmallBatch:
    def __init__(self):
        self.fn = float_batch()  # None: no native kernel here, nothing is eligible
        self._clear()
        self._par: dict = {}  # (id(tolerance), id(unit)) -> the kernel's four parameters
        self._keep: list = []

    def _clear(self) -> None:
        self.desc: list[int] = []  # per tensor: A's address, B's, kinds, elements, rows, row length
        self.par: list[float] = []  # per tensor: atol, rtol, floor, scale
        self.rows: list[int] = []  # rows per tensor (0: no row maxima)
        self.nbytes = 0  # bytes per side (the wider side)
        self.extents: dict[int, list] = {}  # id(mapping) -> [mapping, lo, hi] bytes read
        # file -> (HDF5?, mapping, byte view, address) while tensors wait: held no longer, so a
        # comparison of many files keeps no more mappings alive than the shared scope does
        self._maps: dict = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def full(self) -> bool:
        return self.nbytes >= BATCH_BYTES

    def _address(self, t: StoredTensor, n: int, isz: int) -> int:
        """The address of t's first element in its file's mapping, or 0 when it cannot be read in
        place (read through h5py, out of the file's bounds, misaligned for the kernel)."""
        m = self._maps.get(t.file)
        if m is None:  # once per file: whether it is HDF5 (Path.suffix), its mapping and address
            h5 = t.file.suffix in HDF5_EXT
            m = self._maps[t.file] = (h5,) + (mapped_address(t.file) or (None, None, 0))
        h5, mm, _, base = m
        if mm is None or (h5 and not t.raw):
            return 0
        lo = t.offset
        hi = lo + n * isz
        if lo < 0 or hi > len(mm) or (base + lo) % isz:
            return 0  # the streamed path copies a misaligned tensor, and names a truncated file
        e = self.extents.get(id(mm))
        if e is None:
            self.extents[id(mm)] = [mm, lo, hi]
        else:
            if lo < e[1]:
                e[1] = lo
            if hi > e[2]:
                e[2] = hi
        return base + lo

    def add(self, sa: StoredTensor, sb: StoredTensor, tol: Tolerance, unit: DType, shape: tuple[int, ...]) -> bool:
        """Take this pair into the batch, or False when it must be streamed (not two mapped
        float32/bfloat16 tensors of 1..SMALL elements, or no native kernel)."""
        if self.fn is None or type(sa) is not StoredTensor or type(sb) is not StoredTensor:
            return False
        ka, kb = _KINDS.get(sa.dtype.name), _KINDS.get(sb.dtype.name)
        if ka is None or kb is None or sa.shape != sb.shape:
            return False
        n = math.prod(sa.shape)
        if not 0 < n <= SMALL:
            return False
        pa = self._address(sa, n, _ITEMSIZE[ka])
        pb = self._address(sb, n, _ITEMSIZE[kb]) if pa else 0
        if not pb:
            return False
        par = self._par.get((id(tol), id(unit)))
        if par is None:  # once per tolerance: atol, rtol and the accumulator's own constants
            c = constants(_F32, unit)  # (floor as float32, ULP scale)
            par = self._par[(id(tol), id(unit))] = (tol.effective_atol, tol.rtol, c[3], float(c[4]))
            self._keep.append((tol, unit))  # the ids stay theirs while the batch lives
        self.par += par
        # row maxima as FloatMetrics keeps them: per leading row, for a tensor of 2 or more dims
        r = shape[0] if len(shape) >= 2 else 0
        self.rows.append(r)
        self.desc += (pa, pb, ka | kb << 1, n, r, n // r if r else 0)
        self.nbytes += n * _ITEMSIZE[min(ka, kb)]
        return True

    def run(self) -> list[tuple[list, list, list, list | None, list]]:
        """Measure every pair added: (I, D, percentile bins, row maxima or None, the values of A
        and B at the worst element) per pair, as Python numbers, in the order added; then release
        their pages and empty the batch."""
        k = len(self.rows)
        if not k:
            return []
        out = np.empty((k, _OUT), dtype=np.int64)
        out[:, :22] = STORE0[:22]  # each tensor's fresh counters and accumulators
        rows = self.rows
        rowbuf = np.zeros(max(sum(rows), 1))
        desc = np.array(self.desc, dtype=np.int64)
        par = np.array(self.par, dtype=np.float64)
        rc = self.fn(k, _data(desc), _data(par), _data(rowbuf), _data(out), _QS_PTR, len(_QS))
        if rc:
            raise RuntimeError(f"native float batch failed ({rc})")
        scope = current_scope()
        for mm, lo, hi in self.extents.values():  # the pages read, as a streamed chunk's are
            release_bytes(mm, lo, hi, scope)
        I = out[:, :10].tolist()
        F = out.view(np.float64)[:, 10:24].tolist()  # D, then the two values at the worst element
        P = out[:, 24:].tolist()
        R = rowbuf.tolist()
        res = []
        o = 0
        for j, r in enumerate(rows):
            f = F[j]
            res.append((I[j], f[:12], P[j], R[o : o + r] if r else None, f[12:]))
            o += r
        self._clear()
        return res

    def close(self) -> None:
        self._clear()  # the byte views go: the mappings may be closed again
        self._par.clear()
        self._keep.clear()
