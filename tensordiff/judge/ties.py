"""Tie-aware discrete choices: is a top-k set that differs from the reference's a near-tie?

A top-k over scores that two correct routes compute with different rounding picks different
members wherever two candidates score within that rounding of each other. Such a flip is no bug;
a choice the scores do not explain is one. So each side records, beside the choice
(`<name>.ids`, [R, k], compared as sets per row), the key it ranked (`<name>.scores`, [R, W],
-inf where a candidate was not eligible; column = id). For a row whose sets differ:

    ref_only = A \\ B, cand_only = B \\ A          (-1 pads dropped)
    margin   = max score_ref[ref_only] - min score_ref[cand_only]
               the reference's own lead of what it kept over what the candidate kept instead
    error    = max |score_cand - score_ref| over the row's candidates eligible on both sides
    floor    = 2 * error (+ 4 unit roundoffs of the compared dtype times the scores involved)

A flip needs the two errors to close the margin (e_cand_only - e_ref_only >= margin), so with
scores that are right within the row's error, a genuine near-tie always has margin <= 2 * error.
It is BENIGN when, in addition, the scores themselves are right within tolerance (the scores
tensor judged as any float tensor of the compared dtype is, over the candidates eligible on both
sides: wrong scores are a bug in the scores, not a tie), every member involved is eligible on
both sides (a different eligibility is a different candidate set, not a tie) and the candidate's
own scores rank its picks first (a top-k that ignores its own scores is a bug). Anything else is
a divergence of the choice itself.

When a floor run exists (the oracle in the run precision), the caller may pass its scores as
`floor`: the row's error is then the floor run's error against the reference, not the
candidate's, so how close a tie must be is set by the oracle's own rounding.

A generated token is a top-1 choice of this kind (`token.step.K.ids` beside the logits row it is
the argmax of, `token.step.K.scores`); there "the scores are right" is the verdict the pass gave
the logits themselves (`scores_ok`, from `Contract.scores_source`), floor-relative in the numeric
pass.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from tensordiff.format.dtypes import BY_NAME, to_float64
from tensordiff.format.dump import Entry
from tensordiff.judge.layout import describe
from tensordiff.judge.result import TensorResult
from tensordiff.judge.metrics import FloatMetrics

SHOWN = 8  # flips listed in a report per tensor


@dataclass(frozen=True)
class Flip:
    row: int
    ref_only: tuple[int, ...]
    cand_only: tuple[int, ...]
    margin: float  # the reference's lead, in score units (inf when a member is not eligible)
    floor: float  # how close a tie must be for this row
    benign: bool
    why: str = ""
    meaning: str = ""

    def as_json(self) -> dict:
        return {**asdict(self), "ref_only": list(self.ref_only), "cand_only": list(self.cand_only)}


def _read(entry: Entry, rows: np.ndarray | None = None) -> np.ndarray:
    """The tensor as float64 [R, W] (or only `rows`)."""
    r = entry.stored.reader()
    width = entry.shape[-1] if entry.shape else 1
    try:
        if rows is None:
            out = r.read(0, entry.stored.numel).reshape(-1, width)
        elif len(rows):
            out = np.stack([r.read(int(i) * width, (int(i) + 1) * width) for i in rows])
        else:
            out = np.zeros((0, width), dtype=entry.dtype.storage)
    finally:
        r.close()
    return to_float64(out, entry.dtype) if entry.dtype.is_float else out.astype(np.int64)


def differing_rows(ids_a: np.ndarray, ids_b: np.ndarray) -> np.ndarray:
    return np.nonzero((np.sort(ids_a, axis=1) != np.sort(ids_b, axis=1)).any(axis=1))[0]


def scores_verdict(sa_e: Entry, sb_e: Entry, unit: str, tol) -> tuple[bool, str]:
    """The scores judged as any float tensor of the compared dtype is (`FloatMetrics` with `tol`),
    over the candidates eligible on both sides (eligibility that differs is judged per row).
    (True, "") when they are right within tolerance."""
    a, b = _read(sa_e), _read(sb_e)
    both = np.isfinite(a) & np.isfinite(b)
    a, b = np.where(both, a, 0.0).astype(np.float32), np.where(both, b, 0.0).astype(np.float32)
    f32 = BY_NAME["float32"]
    acc = FloatMetrics(f32, f32, BY_NAME[unit] if unit in BY_NAME else f32, tol, a.shape)
    acc.update(0, a.reshape(-1), b.reshape(-1))
    material, why = acc.verdict()
    return not material, why


def classify_row(row: int, ia: np.ndarray, ib: np.ndarray, sa: np.ndarray, sb: np.ndarray, unit: str,
                 scores_ok: tuple[bool, str] = (True, ""), fa: np.ndarray | None = None,
                 min_err: float = 0.0) -> Flip:
    """One differing row: ia/ib the two choices [k], sa/sb the two sides' scores [W], fa the floor
    run's scores [W] or None; `scores_ok` the scores tensor's own verdict (`scores_verdict`).
    See the module docstring for the rule."""
    A, B = {int(x) for x in ia if x >= 0}, {int(x) for x in ib if x >= 0}
    ro, co = tuple(sorted(A - B)), tuple(sorted(B - A))
    if len(A) != len(B):
        return Flip(row, ro, co, float("inf"), 0.0, False,
                    f"the reference keeps {len(A)} ids, the candidate {len(B)}: a different eligible count")
    width = sa.shape[0]
    if any(i >= width for i in ro + co):
        return Flip(row, ro, co, float("inf"), 0.0, False, f"an id is outside the {width} scored candidates")
    members = np.array(ro + co, dtype=np.int64)
    both = np.isfinite(sa) & np.isfinite(sb)
    if not both[members].all():
        bad = [int(i) for i in members if not both[i]]
        return Flip(row, ro, co, float("inf"), 0.0, False,
                    f"ids {bad} are not eligible on both sides: a different candidate set, not a tie")
    err = float(np.max(np.abs(sb[both] - sa[both])))
    if fa is not None:  # the floor run's own error sets how close a tie must be
        ok = both & np.isfinite(fa)
        err_floor = float(np.max(np.abs(fa[ok] - sa[ok]))) if ok.any() else 0.0
    else:
        err_floor = err
    err_floor = max(err_floor, min_err)  # the row floor its scores were judged by (`settle`'s `min_err`)
    u = BY_NAME[unit].unit_roundoff if unit in BY_NAME else 0.0
    involved = float(np.max(np.abs(sa[members])))
    floor = 2 * err_floor + 4 * u * involved
    margin = float(np.max(sa[list(ro)]) - np.min(sa[list(co)]))
    own = float(np.min(sb[list(co)]) - np.max(sb[list(ro)]))  # the candidate's lead of its picks
    if not scores_ok[0]:
        return Flip(row, ro, co, margin, floor, False, f"the scores themselves diverge ({scores_ok[1]})")
    if own < -(4 * u * involved):
        return Flip(row, ro, co, margin, floor, False,
                    f"the candidate's own scores rank what it dropped {-own:.3g} higher: its top-k ignores them")
    if margin > floor:
        return Flip(row, ro, co, margin, floor, False,
                    f"the reference's margin {margin:.3g} exceeds the tie floor {floor:.3g}")
    return Flip(row, ro, co, margin, floor, True, f"near-tie: margin {margin:.3g} <= floor {floor:.3g}")


def settle(tensors: list[TensorResult], ents_a: dict[str, Entry], ents_b: dict[str, Entry], layout: str, run: dict,
           tolerance_for, floor: dict[str, Entry] | None = None,
           scores_ok: dict[str, tuple[bool, str]] | None = None, min_err: dict[str, float] | None = None) -> None:
    """Re-judge every diverged top-k set tensor of one boundary that has its scores on both sides:
    all of its differing rows near-ties -> status `benign` (the flips listed with their margins);
    any other -> it stays `diverged`, the reason naming the first row the scores do not explain.
    `tolerance_for(unit) -> Tolerance` gives the scores' tolerance in the compared dtype;
    `scores_ok`: the scores' verdict where the pass has it already (scores that are a row of a
    tensor it judged: a generated token's logits, `Contract.scores_source`); `min_err`: the
    least error a row's tie floor takes for those scores (a decode step's logits are judged
    against the floor run's largest prompt row, `floor.row_family`: its error sets the tie)."""
    by = {t.name: t for t in tensors}
    for t in tensors:
        if t.mode != "topk-sets" or t.status != "diverged" or not t.name.endswith(".ids"):
            continue
        sname = t.name[: -len(".ids")] + ".scores"
        if sname not in ents_a or sname not in ents_b:
            t.reason += " (no scores recorded on both sides: a near-tie cannot be told apart)"
            continue
        ea, eb, sa_e, sb_e = ents_a[t.name], ents_b[t.name], ents_a[sname], ents_b[sname]
        if sa_e.shape != sb_e.shape or len(sa_e.shape) != 2 or sa_e.shape[0] != ea.shape[0]:
            t.reason += f" (scores shaped {list(sa_e.shape)} / {list(sb_e.shape)}: cannot judge ties)"
            continue
        ia, ib = _read(ea), _read(eb)
        rows = differing_rows(ia, ib)
        st = by.get(sname)
        unit = (st.dtype.get("unit") if st is not None else None) or sa_e.dtype.name
        ok = (scores_ok or {}).get(sname) or scores_verdict(sa_e, sb_e, unit, tolerance_for(unit))
        sa, sb = _read(sa_e, rows), _read(sb_e, rows)
        fe = floor.get(sname) if floor else None
        fa = _read(fe, rows) if fe is not None and fe.shape == sa_e.shape else None
        flips = []
        for j, r in enumerate(rows):
            f = classify_row(int(r), ia[r], ib[r], sa[j], sb[j], unit, ok, None if fa is None else fa[j],
                             (min_err or {}).get(sname, 0.0))
            flips.append(replace(f, meaning=describe(layout, (int(r),), run)))  # (asdict deep-copied every row)
        bad = [f for f in flips if not f.benign]
        t.metrics = replace(t.metrics, ties={
            "rows_differ": len(flips), "benign": len(flips) - len(bad),
            "max_benign_margin": max((f.margin for f in flips if f.benign), default=0.0),
            "flips": [f.as_json() for f in (bad + [f for f in flips if f.benign])[:SHOWN]]})
        if bad:
            f = bad[0]
            t.reason = (f"{len(bad)} of {len(flips)} differing rows are not near-ties; row {f.row}"
                        f"{' (' + f.meaning + ')' if f.meaning else ''}: reference keeps {list(f.ref_only)}, "
                        f"candidate {list(f.cand_only)}: {f.why}")
        else:
            t.status = "benign"
            worst = max(flips, key=lambda f: f.margin / f.floor if f.floor else 0.0)
            t.reason = (f"{len(flips)} rows flip on near-ties (largest margin {worst.margin:.3g} at row {worst.row}, "
                        f"floor {worst.floor:.3g}): benign")
