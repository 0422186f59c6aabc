"""Running the hypotheses on a diverged boundary: search on sampled rows, confirm the best by
streaming the whole tensor, keep the one that explains most (if it explains enough)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensordiff.judge.contract import Boundary, Contract
from tensordiff.format.dump import Dump
from tensordiff.format.storage import StoredTensor
from tensordiff.judge.diagnosis import affine, column_maps, row_maps
from tensordiff.judge.diagnosis.finding import MIN_EXPLAINED, Finding, explained
from tensordiff.judge.diagnosis.matrix import Matrix, Predict, residual, sample_rows, sq
from tensordiff.judge.diagnosis.mrope_sections import mrope_findings
from tensordiff.judge.diagnosis.pairs import pair_findings
from tensordiff.judge.diagnosis.transposed import transposed_findings
from tensordiff.judge.diagnosis.int_offset import INT_MAX, offset_findings
from tensordiff.judge.diagnosis.sizes import size_findings

CONFIRM = 3  # candidates confirmed on the whole tensor (each one streamed pass)
MAX_ROOTS = 4  # boundaries diagnosed per report
# Hypotheses with more freedom (a parameter per row, channel or range): within NEAR of the best,
# the simpler one is reported (a shift by 3 rather than "rows 3-199 shifted, rows 0-2 too")
LOOSE = {"row-range-shift", "placeholder-rows", "column-permutation", "channel-scale", "channel-offset", "row-scale"}
NEAR = 0.02


def best_first(findings: list[Finding]) -> list[Finding]:
    out = sorted(findings, key=lambda f: -f.explained)
    if out:
        top = out[0].explained
        out.sort(key=lambda f: (f.explained < top - NEAR, f.name in LOOSE, -f.explained))
    return out


@dataclass(frozen=True)
class Candidate:
    """A hypothesis as the search scored it: the share of the SAMPLED rows' error it removes."""

    share: float
    kind: str
    name: str
    text: str
    predict: Predict  # B's rows [r0, r1) as the hypothesis predicts them from A, for the confirmation


def diagnose_tensor(name: str, sa: StoredTensor, sb: StoredTensor, layout: str, run: dict) -> list[Finding]:
    """Every confirmed finding for one float tensor, best first (the caller keeps what explains enough)."""
    if sa.numel == 0 or not (sa.dtype.is_float and sb.dtype.is_float):
        return []
    if sa.shape != sb.shape:
        return transposed_findings(name, sa, sb)
    with Matrix(sa) as a, Matrix(sb) as b:
        rows = sample_rows(a.rows, a.cols)
        xa, xb = a.take(rows), b.take(rows)
        e0 = sq(xb, xa)
        scored: list[Candidate] = []
        if e0 > 0:
            maps = row_maps.grid_maps(layout, a.rows, run)
            if a.rows > 1:
                maps += row_maps.shift_maps(a, b, rows, row_maps.match_rows(a, rows, xa, xb), layout, run, xb)
            for m in maps:
                pred = row_maps.predict_rows(a, m, rows, xb)
                scored.append(Candidate(explained(e0, sq(xb, pred)), "rows", m.name, m.text,
                                        lambda r0, r1, m=m: row_maps.predict_rows(a, m, np.arange(r0, r1),
                                                                                  b.read(r0, r1))))
            cmaps = column_maps.named_maps(a.cols)
            mm = column_maps.matched_map(xa, xb)
            if mm is not None:
                cmaps.append(mm)
            for m in cmaps:
                scored.append(Candidate(explained(e0, sq(xb, xa[:, m.perm])), "columns", m.name,
                                        m.text, lambda r0, r1, m=m: a.read(r0, r1)[:, m.perm]))
        scored.sort(key=lambda c: -c.share)
        out = []
        for c in scored[:CONFIRM]:
            if c.share < MIN_EXPLAINED * 0.9:  # the sample says it cannot reach the bar
                break
            err, res = residual(a, b, c.predict)
            out.append(Finding(name, c.kind, c.name, c.text, explained(err, res)))
        out += affine.findings(name, a, b, layout, run)
    return best_first(out)


def testable(st: StoredTensor) -> bool:
    """Float tensors, and integer ones compared exactly (plan sizes, positions; a choice of ids is
    judged as sets by `ties`, and never reaches here)."""
    return st.dtype.is_float or (st.dtype.kind == "int" and 0 < st.numel <= INT_MAX)


def diagnose_boundary(bd: Boundary, names_a: dict[str, StoredTensor], names_b: dict[str, StoredTensor],
                      diverged: list[str], run: dict, inputs_a: dict[str, StoredTensor] | None = None
                      ) -> list[Finding] | None:
    """The findings that explain a diverged boundary: one per diverged tensor at most (or one for
    a swapped pair or an M-RoPE cos / sin pair, or one for the sizes), each explaining at least
    MIN_EXPLAINED of its error; None when none of its diverged tensors is of a kind the hypotheses
    test. `inputs_a`: A's tensors of the boundary's inputs (the M-RoPE position ids)."""
    diverged = [n for n in diverged if testable(names_a[n]) and testable(names_b[n])]
    if not diverged:
        return None
    out: list[Finding] = []
    ints = [n for n in diverged if not names_a[n].dtype.is_float]
    if ints:
        ia, ib = {n: names_a[n] for n in ints}, {n: names_b[n] for n in ints}
        # the `plan` (every model's first boundary, by the contracts' convention) holds sizes
        out += size_findings(bd.meaning, ia, ib) if bd.name == "plan" else offset_findings(ia, ib)
    floats = [n for n in diverged if names_a[n].dtype.is_float]
    pair = [f for f in pair_findings({n: names_a[n] for n in names_a}, {n: names_b[n] for n in names_b})
            + mrope_findings(names_a, names_b, inputs_a or {})
            if f.explained >= MIN_EXPLAINED and any(t in floats for t in f.tensor.split(" / "))]
    if pair:
        out.append(max(pair, key=lambda f: f.explained))
        covered = set(out[-1].tensor.split(" / "))
        floats = [n for n in floats if n not in covered]
    for n in floats:
        best = [f for f in diagnose_tensor(n, names_a[n], names_b[n], bd.layout, run) if f.explained >= MIN_EXPLAINED]
        if best:
            out.append(best[0])
    return merged(out)


def merged(findings: list[Finding]) -> list[Finding]:
    """One line for tensors of a boundary that one hypothesis explains alike (rope.cos and rope.sin)."""
    out: dict[tuple[str, str, str], Finding] = {}
    for f in findings:
        k = (f.kind, f.name, f.text)
        g = out.get(k)
        out[k] = f if g is None else Finding(f"{g.tensor} / {f.tensor}", f.kind, f.name, f.text,
                                             min(g.explained, f.explained))
    return list(out.values())


def diagnose_report(results, da: Dump, db: Dump, contract: Contract, bounds: list[Boundary] | None = None) -> list[str]:
    """Fill `diagnosis` of the root boundaries among `results` (BoundaryResults, at most MAX_ROOTS):
    findings, or [] for "no simple explanation". Boundaries that match are never diagnosed.
    Returns notes for the report: a diagnosis that fails is said there and never costs the
    comparison its verdict."""
    notes: list[str] = []
    by = {b.name: b for b in (bounds or contract.boundaries)}
    ea = {e.name: e for e in da.entries}
    eb = {e.name: e for e in db.entries}
    run = da.run or db.run
    for br in [b for b in results if b.root][:MAX_ROOTS]:
        diverged = [t.name for t in br.tensors if t.status in ("diverged", "incomparable")
                    and t.mode in ("values", "exact") and t.name in ea and t.name in eb]
        if not diverged:
            continue
        bd = by.get(br.name, Boundary(br.name, layout=br.layout, meaning=br.meaning))
        names = [t.name for t in br.tensors if t.name in ea and t.name in eb]
        inputs_a = {n: e.stored for n, e in ea.items() if e.boundary in bd.inputs}
        try:
            found = diagnose_boundary(bd, {n: ea[n].stored for n in names}, {n: eb[n].stored for n in names},
                                      diverged, run, inputs_a)
        except Exception as e:  # the verdict stands without it
            notes.append(f"the diagnosis of `{br.name}` failed ({type(e).__name__}: {str(e)[:200]})")
            continue
        if found is not None:
            br.diagnosis = [f.as_json() for f in found]
    return notes
