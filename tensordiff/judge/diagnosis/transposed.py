"""A tensor stored transposed: B is [C, N] where A is [N, C] (the two sides cannot be compared
element by element, so the judge calls it incomparable; this says why)."""
from __future__ import annotations

import numpy as np

from tensordiff.judge.stream import CHUNK
from tensordiff.judge.diagnosis.finding import Finding
from tensordiff.judge.diagnosis.matrix import Matrix

MAX_PASSES = 16  # B's rows are A's columns: each chunk of them is one pass over A


def transposed_findings(name: str, sa, sb) -> list[Finding]:
    if len(sa.shape) != 2 or tuple(sb.shape) != tuple(sa.shape[::-1]) or sa.numel > MAX_PASSES * CHUNK:
        return []
    err = res = 0.0
    with Matrix(sa) as a, Matrix(sb) as b:
        for r0, r1 in b.chunks():
            xb = b.read(r0, r1)
            cols = np.concatenate([a.read(s0, s1)[:, r0:r1] for s0, s1 in a.chunks()]).T  # A[:, r0:r1] as rows
            res += float(((xb - cols) ** 2).sum())
            err += float((xb ** 2).sum()) + float((cols ** 2).sum())  # nothing lines up: both sides' energy
    share = 1.0 - res / err if err > 0 else 0.0
    return [Finding(name, "rows", "transposed", f"B is A transposed (B {list(sb.shape)} holds A {list(sa.shape)} "
                    "with its two dimensions swapped)", max(0.0, share))] if share >= 0.95 else []
