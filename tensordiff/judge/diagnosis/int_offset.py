"""Integer tensors outside the `plan` (positions, rope deltas): B equals A plus one constant
wherever the two differ (a position delta left out or added twice)."""
from __future__ import annotations

import numpy as np

from tensordiff.judge.diagnosis.finding import Finding
from tensordiff.judge.diagnosis.matrix import Matrix

INT_MAX = 1 << 22  # integer elements streamed for the check (positions: 3 x S)


def offset_findings(names_a: dict, names_b: dict) -> list[Finding]:
    deltas: set[int] = set()
    where: dict[str, int] = {}
    for n, sa in names_a.items():
        sb = names_b.get(n)
        if sb is None or sa.shape != sb.shape or sa.numel > INT_MAX:
            return []
        count = 0
        with Matrix(sa) as a, Matrix(sb) as b:
            for r0, r1 in b.chunks():
                d = b.read(r0, r1) - a.read(r0, r1)  # float64: exact for these magnitudes
                nz = d[d != 0]
                deltas.update(np.unique(nz).astype(np.int64).tolist())
                count += nz.size
                if len(deltas) > 1:
                    return []
        if count:
            where[n] = count
    if len(deltas) != 1:
        return []
    (k,) = deltas
    what = ", ".join(f"{c} of `{n}`" for n, c in where.items())
    return [Finding(" / ".join(where), "offset", "int-offset", f"B equals A {'+' if k > 0 else '-'} {abs(k)} wherever they differ ({what}): "
                    "one constant offset (e.g. a position delta left out or added twice)", 1.0)]
