"""A swapped pair: a boundary's two tensors of one shape exchanged (cos <-> sin)."""
from __future__ import annotations

from tensordiff.judge.diagnosis.finding import Finding, explained
from tensordiff.judge.diagnosis.matrix import Matrix, residual

PAIRS = ((".cos", ".sin"),)


def pair_findings(names_a: dict, names_b: dict) -> list[Finding]:
    """`names_*`: tensor name -> StoredTensor of one boundary, both sides."""
    out = []
    for x, y in PAIRS:
        for n in names_a:
            if not n.endswith(x):
                continue
            m = n[: -len(x)] + y
            if m not in names_a or n not in names_b or m not in names_b:
                continue
            ta, tb = names_a[n], names_a[m]
            if ta.shape != tb.shape or names_b[n].shape != ta.shape or names_b[m].shape != ta.shape:
                continue
            err = res = 0.0
            for own, other in ((n, m), (m, n)):
                with Matrix(names_a[own]) as a_own, Matrix(names_a[other]) as a_other, Matrix(names_b[own]) as b:
                    e, _ = residual(a_own, b, lambda r0, r1: a_own.read(r0, r1))
                    _, r = residual(a_own, b, lambda r0, r1: a_other.read(r0, r1))
                err, res = err + e, res + r
            out.append(Finding(f"{n} / {m}", "pair", "pair-swapped", f"B's {n} is A's {m} and B's {m} is A's {n} "
                               f"(the pair swapped)", explained(err, res)))
    return out
