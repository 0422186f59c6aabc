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
    for I, D, pct_bins, rows in batch.run():     # in the order added; the batch is empty after
        ...
"""
from __future__ import annotations

import math

import numpy as np

from .dtypes import DType
from .metrics import _NBINS, _STORE0, PERCENTILES, _constants
from .storage import StoredTensor, current_scope, mapped_address, release_bytes
from .tolerance import Tolerance

SMALL = 1 << 16  # elements per side at most: above, per-call costs are noise beside the work, and
# a large tensor is better streamed in chunks over the worker threads
BATCH_BYTES = 8 << 20  # a batch is run once it holds this many bytes per side: resident memory stays
# bounded (its pages are released after it, like a streamed chunk's) and results come in steps
_KINDS = {"float32": 0, "bfloat16": 1}
_F32 = np.dtype(np.float32)
_QS = np.array(PERCENTILES, dtype=np.float64)


class SmallBatch:
    def __init__(self):
        from .native import float_batch

        self.fn = float_batch()  # None: no native kernel here, nothing is eligible
        self._clear()
        self._maps: dict = {}  # file -> (mapping, byte view, address) while the batch lives

    def _clear(self) -> None:
        self.a: list[int] = []
        self.b: list[int] = []
        self.kinds: list[int] = []
        self.n: list[int] = []
        self.par: list[float] = []
        self.rows: list[int] = []  # rows per tensor (0: no row maxima)
        self.row: list[int] = []
        self.nbytes = 0  # bytes per side (the wider side)
        self.extents: dict[int, list] = {}  # id(mapping) -> [mapping, lo, hi] bytes read

    def __len__(self) -> int:
        return len(self.n)

    @property
    def full(self) -> bool:
        return self.nbytes >= BATCH_BYTES

    def _address(self, t: StoredTensor) -> int:
        """The address of t's first element in its file's mapping, or 0 when it cannot be read in
        place (not mapped, out of the file's bounds, misaligned for the kernel)."""
        m = self._maps.get(t.file)
        if m is None:
            m = self._maps[t.file] = mapped_address(t.file) or (None, None, 0)
        mm, _, base = m
        if mm is None:
            return 0
        lo, hi = t.offset, t.offset + t.numel * t.dtype.itemsize
        if lo < 0 or hi > len(mm) or (base + lo) % t.dtype.itemsize:
            return 0  # the streamed path copies a misaligned tensor, and names a truncated file
        e = self.extents.get(id(mm))
        if e is None:
            self.extents[id(mm)] = [mm, lo, hi]
        else:
            e[1], e[2] = min(e[1], lo), max(e[2], hi)
        return base + lo

    def add(self, sa: StoredTensor, sb: StoredTensor, tol: Tolerance, unit: DType, shape: tuple[int, ...]) -> bool:
        """Take this pair into the batch, or False when it must be streamed (not two mapped
        float32/bfloat16 tensors of 1..SMALL elements, or no native kernel)."""
        if self.fn is None or type(sa) is not StoredTensor or type(sb) is not StoredTensor:
            return False
        ka, kb = _KINDS.get(sa.dtype.name), _KINDS.get(sb.dtype.name)
        n = sa.numel
        if ka is None or kb is None or not 0 < n <= SMALL or sb.numel != n or not (sa.mapped and sb.mapped):
            return False
        pa = self._address(sa)
        pb = self._address(sb) if pa else 0
        if not pb:
            return False
        self.a.append(pa)
        self.b.append(pb)
        self.kinds.append(ka | kb << 1)
        self.n.append(n)
        c = _constants(_F32, unit)  # the accumulator's own constants: floor as float32, ULP scale
        self.par += (tol.effective_atol, tol.rtol, c[3], float(c[4]))
        # row maxima as FloatMetrics keeps them: per leading row, for a tensor of 2 or more dims
        if len(shape) >= 2:
            self.rows.append(shape[0])
            self.row.append(math.prod(shape[1:]))
        else:
            self.rows.append(0)
            self.row.append(0)
        self.nbytes += n * max(sa.dtype.itemsize, sb.dtype.itemsize)
        return True

    def run(self) -> list[tuple[list, list, list, list | None]]:
        """Measure every pair added: (I, D, percentile bins, row maxima or None) per pair, as
        Python numbers, in the order added; then release their pages and empty the batch."""
        k = len(self.n)
        if not k:
            return []
        store = np.tile(_STORE0[:22], (k, 1))  # each tensor's fresh counters and accumulators
        pct = np.empty((k, len(_QS)), dtype=np.int64)
        nrows = np.array(self.rows, dtype=np.int64)
        offs = np.zeros(k, dtype=np.int64)
        np.cumsum(nrows[:-1], out=offs[1:])
        rowbuf = np.zeros(max(int(offs[-1] + nrows[-1]), 1))
        rptr = np.where(nrows > 0, rowbuf.__array_interface__["data"][0] + 8 * offs, 0).astype(np.uint64)
        cols = (np.array(self.a, dtype=np.uint64), np.array(self.b, dtype=np.uint64),
                np.array(self.kinds, dtype=np.int32), np.array(self.n, dtype=np.int64),
                np.array(self.par, dtype=np.float32), rptr, np.array(self.row, dtype=np.int64))
        ptr = [c.__array_interface__["data"][0] for c in cols]
        rc = self.fn(k, *ptr, store.__array_interface__["data"][0], _QS.__array_interface__["data"][0], len(_QS),
                     pct.__array_interface__["data"][0])
        if rc:
            raise RuntimeError(f"native float batch failed ({rc})")
        scope = current_scope()
        for mm, lo, hi in self.extents.values():  # the pages read, as a streamed chunk's are
            release_bytes(mm, lo, hi, scope)
        I = store[:, :10].tolist()
        D = store[:, 10:22].copy().view(np.float64).tolist()
        P = pct.tolist()
        R = rowbuf.tolist()
        out = [(I[j], D[j], P[j], R[o : o + r] if r else None)
               for j, (o, r) in enumerate(zip(offs.tolist(), self.rows))]
        self._clear()
        return out

    def close(self) -> None:
        self._maps.clear()  # the byte views go: the mappings may be closed again
