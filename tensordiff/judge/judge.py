"""The judge: how a tensor of a model is compared, the same on every route and in every pass.

End to end (the walk: the oracle's dump against the engine's) and locally (`local_error`: the
oracle's tensor against the engine stage's output on the oracle's inputs), a tensor is judged by
one `Judge`, built once from

- the model's contract: its comparison modes (`TensorRule`), its probes, and the tolerances the
  model itself knows it needs (`Contract.tolerances`, e.g. `index.*` near-tie top-k rows), merged
  BENEATH the user's tolerances, so a user's matching table wins;
- the user's tolerances (a TOML file, `[tool.tensordiff]`, or the dtype defaults);
- the tie rule (`ties`): a top-k set tensor that differs only where the scores recorded beside
  it are near-tied is `benign`, anything else diverges at the choice itself;
- the runs' compute dtypes: a tensor stored in fp32 by a bf16 run (router weights, logits)
  carries bf16 error, so it is judged in the narrowest of its two stored dtypes and the dtypes
  the two runs computed in;
- the pass's rule: direct (a tolerance per dtype), or, in the numeric pass, the floor rule
  (`floor.FloorRule`: a float tensor's error against the fp32 reference as a multiple of the
  oracle's own error in the run's precision, the floor run) with the calibrated profile.

    judge = Judge.build(contract, tolerances, run_dtypes=("float32", "bfloat16"))
    tr = judge.tensor(entry_a, entry_b, boundary, run)         # one TensorResult
    br = judge.boundary(boundary, entries_a, entries_b, run)   # tensors, probes, status

A is the reference (the oracle), B the candidate (the engine or its stage), F the floor run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np

from tensordiff.judge import floor as floors, scale, stream, ties
from tensordiff.judge.batch import SmallBatch
from tensordiff.judge.contract import Boundary, Contract
from tensordiff.format.dtypes import BY_NAME, DType, narrower, to_float64
from tensordiff.format.dump import Entry
from tensordiff.errors import BadInput
from tensordiff.judge.layout import describe
from tensordiff.judge.metrics import (
    FIRST_BAD, MISMATCH, WORST, ExactMetrics, FloatMetrics, TopKSetMetrics, float_result, float_verdict,
)
from tensordiff.judge.probes import PROBES
from tensordiff.judge.result import PASSING, BoundaryResult, TensorResult
from tensordiff.judge.rows import block_sizes
from tensordiff.judge.tolerance import load as load_tolerances, Tolerance, Tolerances, with_contract

Progress = Callable[[int], None]  # called with bytes consumed (both sides)
# A boundary's status from its tensors' statuses: the first of these present wins; `benign` is a
# top-k set that differs only on near-ties (`ties`), which does not fail a run.
SETTLE_ORDER = ("incomparable", "missing", "diverged", "benign")


@dataclass(frozen=True)
class Judge:
    contract: Contract
    tolerances: Tolerances  # the contract's tables already merged beneath the user's
    run_dtypes: tuple[str, ...] = ()  # the compute dtypes of the two runs (float names only count)
    # the numeric pass's rule: float values judged against the floor run (None: the direct rule)
    floor_rule: floors.FloorRule | None = None
    profile: Mapping | None = field(default=None, compare=False, repr=False)  # calibrated, by tensor
    # reference tensor -> its measured scale (`scale.scaled`): the pipeline hands one judge to a
    # case's comparison and to its local error, which judge the same oracle tensors
    scales: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, contract: Contract, tolerances: Tolerances | str | None = None,
              run_dtypes: Iterable[str | None] = (), *, floor_rule: floors.FloorRule | None = None,
              profile: Mapping | None = None) -> "Judge":
        tols = tolerances if isinstance(tolerances, Tolerances) else load_tolerances(tolerances)
        dts = tuple(dict.fromkeys(d for d in run_dtypes if isinstance(d, str) and d in BY_NAME
                                  and BY_NAME[d].is_float))
        merged = with_contract(tols, contract.tolerances, contract.tolerances_source or f"contract {contract.model}")
        return cls(contract, merged, dts, floor_rule, profile)

    def numeric(self, rule: floors.FloorRule = floors.DEFAULT_RULE, profile: Mapping | None = None) -> "Judge":
        """This judge for the numeric pass: float values against the floor run by `rule`."""
        return Judge(self.contract, self.tolerances, self.run_dtypes, rule, profile, self.scales)

    # ------------------------------------------------------------------ the rules

    def mode(self, name: str, dtype: DType) -> str:
        return self.contract.mode_for(name) or ("values" if dtype.is_float else "exact")

    def unit(self, da: DType, db: DType, boundary: str = "", run: dict | None = None) -> DType:
        """The float dtype a float tensor pair is judged in: its tolerance and ULP unit. A run may
        declare another compute dtype for some boundaries (`run.boundary_dtypes`: fnmatch pattern
        -> dtype; the DeepSeek language half in bf16 behind an fp32 vision tower)."""
        unit = narrower(da, db)
        for name in self.run_dtypes + boundary_dtypes(boundary, run):
            unit = narrower(unit, BY_NAME[name])
        return unit

    def tolerance(self, boundary: str, dtype: str) -> Tolerance:
        """`dtype` is the comparison unit's name for a float tensor, "int" for the others."""
        return self.tolerances.for_(boundary, dtype)

    # ------------------------------------------------------------------ one tensor

    def tensor(self, ea: Entry, eb: Entry, boundary: Boundary, run: dict, *, progress: Progress | None = None,
               verify: bool = False) -> TensorResult:
        res, mode, unit, tol = self._begin(ea, eb, boundary, run)
        if mode is None:
            return res
        return self._stream(res, ea, eb, boundary, run, mode, unit, tol, progress, verify)

    def _begin(self, ea: Entry, eb: Entry, boundary: Boundary, run: dict, memo: dict | None = None) -> tuple:
        """(result, mode, unit, tolerance): the result as far as the rules settle it (mode None:
        nothing to measure), else what to measure it with. `memo`: a boundary's rules by dtype
        pair, found once for its many tensors (a tolerance that depends on the tensor, a
        magnitude-aware atol, is measured per tensor still)."""
        da, db = ea.dtype, eb.dtype
        res = TensorResult(ea.name, boundary.name, "match", dtype={"a": da.name, "b": db.name},
                           shape={"a": list(ea.shape), "b": list(eb.shape)})
        if ea.shape != eb.shape:
            res.status, res.reason = "incomparable", f"shape {list(ea.shape)} vs {list(eb.shape)}"
            return res, None, None, None
        if da.is_float != db.is_float:
            res.status, res.reason = "incomparable", f"{da.name} vs {db.name} (float vs integer)"
            return res, None, None, None
        if not ea.stored.numel:  # equal shapes with a zero in them: reported as not compared, never as a match
            res.status, res.reason = "skipped", f"empty on both sides (shape {list(ea.shape)}): no element to compare"
            return res, None, None, None
        mode = res.mode = self.mode(ea.name, da)
        if not da.is_float:
            tol = self.tolerance(boundary.name, "int")
            res.tolerance = tol.as_dict()
            return res, mode, None, tol
        rule = memo.get((da.name, db.name)) if memo is not None else None
        if rule is None:
            unit = self.unit(da, db, boundary.name, run)
            tol = self.tolerance(boundary.name, unit.name)
            rule = (unit, tol, None if tol.atol_scale else tol.as_dict())
            if memo is not None:
                memo[(da.name, db.name)] = rule
        unit, tol, tol_dict = rule
        res.dtype["unit"] = unit.name
        if mode == "scores":
            # the ranking key behind a top-k choice: not judged as values (-inf marks candidates
            # not eligible, and a near-tie makes no error material); the tie rule reads it
            res.tolerance = tol.as_dict() if tol_dict is None else dict(tol_dict)
            res.reason = "the scores behind this boundary's choice (read by the tie rule)"
            return res, None, None, None
        if mode == "values" and tol.atol_scale:
            tol = scale.scaled(tol, ea.stored, self.scales, ea.sha256)  # magnitude-aware: the reference's RMS
            tol_dict = None
        res.tolerance = tol.as_dict() if tol_dict is None else dict(tol_dict)
        return res, mode, unit, tol

    def _stream(self, res: TensorResult, ea: Entry, eb: Entry, boundary: Boundary, run: dict, mode: str,
                unit: DType | None, tol: Tolerance, progress: Progress | None, verify: bool) -> TensorResult:
        """Measure one tensor pair chunk by chunk (`stream`), then settle its result."""
        da, db = ea.dtype, eb.dtype
        if da.is_float:
            acc = FloatMetrics(da, db, unit, tol, ea.shape) if mode == "values" else ExactMetrics(da, db)
        else:
            k = ea.shape[-1] if ea.shape else 1
            acc = TopKSetMetrics(k, tol) if mode == "topk-sets" else ExactMetrics(da, db)
        row = (ea.shape[-1] if mode == "topk-sets" and ea.shape
               else (math.prod(ea.shape[1:]) if len(ea.shape) >= 2 else 0))
        ha, hb = stream.sha256_pair(verify, ea.sha256, eb.sha256)
        acc = stream.stream_pair(ea.stored, eb.stored, acc, stream.chunk_len(row), progress=progress, hashes=(ha, hb))
        for h, ent, side in ((ha, ea, "A"), (hb, eb, "B")):
            if h and h.hexdigest() != ent.sha256:
                raise BadInput(f"{ent.stored.file}: tensor {ent.name!r} (side {side}) fails its sha256: the file is corrupt")
        if isinstance(acc, FloatMetrics) and not acc.exact_percentiles():
            # the tensor's percentiles moved from where its first chunk put them: once more, counting
            # every bin (rare; metrics.CUT_MIN says why the first pass counts only a few)
            acc = stream.stream_pair(ea.stored, eb.stored, acc.again(), stream.chunk_len(row))
        res.metrics = acc.result()
        material, why = acc.verdict()
        rows = acc.rows.tolist() if isinstance(acc, FloatMetrics) and acc.rows is not None else None
        return self._settle(res, ea, eb, boundary, run, material, why, acc.worst, rows)

    def _settle(self, res: TensorResult, ea: Entry, eb: Entry, boundary: Boundary, run: dict, material: bool,
                why: str, worst: int, rows: list | None, values: list | None = None) -> TensorResult:
        """A measured tensor's status, its worst element (where, what it means, both values: read
        here, or `values` as the native batch read them) and its row maxima: the same for a
        streamed tensor and one of a native batch."""
        if material:
            res.status, res.reason = "diverged", why
        if worst >= 0 and ea.stored.numel:
            idx = _unravel(worst, ea.shape)
            res.worst = {"index": list(idx), "meaning": describe(boundary.layout, idx, run)}
            if values is not None:
                res.worst["a"], res.worst["b"] = values
            else:
                res.worst.update(_values_at(ea, eb, worst))
        if rows is not None:
            res.row_error = rows
        return res

    def three_way(self, er: Entry, ef: Entry, ec: Entry, boundary: Boundary, run: dict,
                  seen: "Seen | None" = None) -> TensorResult:
        """One float tensor in the numeric pass: the candidate's error against the reference as a
        multiple of the floor run's (`floor.statistics`). A decode step `X.step.K` is one more row
        of `X` (`floor.row_family`: judged against `X`'s largest floor row, which `seen` keeps).
        Where precision moves nothing (a zero floor) the engine may still differ by an ulp on
        another device's kernels, so such a tensor is judged element by element by the direct
        rule, no element allowed outside atol + rtol·|a|; the calibrated profile
        (`must_equal_floor_run`) keeps bit-exactness where the clean engine has it."""
        rule = self.floor_rule or floors.DEFAULT_RULE
        seen = seen if seen is not None else Seen()
        fam = floors.row_family(er.name)
        if fam is not None and fam not in seen.families and fam not in seen.judged and seen.ref is not None \
                and seen.floor is not None and fam in seen.ref.names and fam in seen.floor.names:
            seen.families[fam] = floors.family_floor(seen.ref.entry(fam), seen.floor.entry(fam))
        family = (fam, seen.families[fam]) if fam in seen.families else None
        profile = (self.profile or {}).get(er.name)
        st = floors.statistics(er, ef, ec, rule, boundary.layout, run, profile, family)
        local = st.pop("_local")
        t = TensorResult(er.name, boundary.name, "diverged" if st.pop("material") else "match", reason=st.pop("reason"),
                         mode="floor", dtype={"a": er.dtype.name, "floor": ef.dtype.name, "b": ec.dtype.name},
                         shape={"a": list(er.shape), "b": list(ec.shape)}, metrics=st,
                         tolerance={"rule": rule.as_dict(), "source": f"floor-relative, {rule.source} multipliers"
                                    + (", the clean engine's calibrated profile" if profile else "")})
        if len(er.shape) >= 2:  # per-row × floor: the heatmap's values (a block's on each of its rows)
            sizes = block_sizes(st["rows"], st["rows_per_block"])
            t.row_error = [float(x) if math.isfinite(x) else 1e30 for x in np.repeat(local, sizes)]
        if st["worst_rows"] and not st["exact_floor"]:
            w = st["worst_rows"][0]
            t.worst = {"index": [w["row"]], "meaning": w["meaning"], "x_floor": w["x_floor"]}
        if st.get("rows", 0) > 1 and not st.get("exact_floor"):
            seen.families[er.name] = st["floor"]["row_max"]
        if t.status == "diverged" and st["exact_floor"] and not st.get("must_equal_floor_run"):
            direct = self.tensor(er, ec, boundary, run)
            bad = getattr(direct.metrics, "mismatches", 0)
            if direct.status == "match" and bad:
                direct.status = "diverged"
                direct.reason = (f"{bad} elements outside atol + rtol·|a| where precision moves nothing "
                                 "(zero floor): none may be")
            elif direct.status == "match":
                direct.reason = "zero floor (precision-independent): within the direct tolerance, no element outside"
            t = direct
        return t

    def waiting(self, progress: Progress | None = None) -> "Waiting":
        """Somewhere for small float pairs to wait for one native call, across boundaries."""
        return Waiting(self, progress)

    # ------------------------------------------------------------------ one boundary

    def boundary(self, bd: Boundary, ents_a: Mapping[str, Entry], ents_b: Mapping[str, Entry], run: dict, *,
                 progress: Progress | None = None, verify: bool = False,
                 missing: tuple[str, str] = ("not in A", "not in B"),
                 floor: Mapping[str, Entry] | None = None, seen: "Seen | None" = None) -> BoundaryResult:
        """Every tensor of `bd` on both sides, then its probes, then the tie rule for its top-k
        sets, then its status. `missing` is the reason given for a tensor that only B has, and
        for one that only A has. `floor`: the entries of the oracle's run in the candidate's
        precision, when there is one (the tie rule's floor is then its error, not B's; in the
        numeric pass, every float tensor's floor)."""
        with self.waiting(progress) as small:
            br = self.measure(bd, ents_a, ents_b, run, progress=progress, verify=verify, missing=missing, small=small,
                              floor=floor, seen=seen)
        return self.conclude(bd, br, ents_a, ents_b, run, floor=floor, seen=seen)

    def measure(self, bd: Boundary, ents_a: Mapping[str, Entry], ents_b: Mapping[str, Entry], run: dict, *,
                progress: Progress | None = None, verify: bool = False,
                missing: tuple[str, str] = ("not in A", "not in B"), small: "Waiting | None" = None,
                floor: Mapping[str, Entry] | None = None, seen: "Seen | None" = None) -> BoundaryResult:
        """Every tensor of `bd` measured (streamed), or waiting in `small` for one native call
        with others (its result is filled in place when `small` runs; the tensors keep their
        order). `conclude` then settles the boundary, once `small` has run. In the numeric pass
        a float tensor present on all three runs is judged against its floor (`three_way`)."""
        br = BoundaryResult(bd.name, "match", meaning=bd.meaning, layout=bd.layout)
        memo: dict = {}
        small = small if not verify else None  # --verify hashes every tensor: streamed
        numeric = self.floor_rule is not None and floor is not None
        for name in list(ents_a) + [n for n in ents_b if n not in ents_a]:
            if numeric and not (name in ents_a and name in floor and name in ents_b):
                where = [w for w, d in (("reference", ents_a), ("floor run", floor), ("candidate", ents_b))
                         if name not in d]
                br.tensors.append(TensorResult(name, bd.name, "missing", reason=f"not in the {', '.join(where)}"))
                continue
            if name not in ents_a or name not in ents_b:
                side, e = ("a", ents_a[name]) if name in ents_a else ("b", ents_b[name])
                br.tensors.append(TensorResult(name, bd.name, "missing", reason=missing[1] if side == "a" else missing[0],
                                               dtype={side: e.dtype.name}, shape={side: list(e.shape)}))
                continue
            ea, eb = ents_a[name], ents_b[name]
            if numeric:
                ef = floor[name]
                if not (ea.shape == ef.shape == eb.shape):
                    br.tensors.append(TensorResult(name, bd.name, "incomparable",
                                                   reason=f"shapes {list(ea.shape)}, {list(ef.shape)}, {list(eb.shape)}"))
                    continue
                if ea.dtype.is_float and ef.dtype.is_float and eb.dtype.is_float and self.mode(name, ea.dtype) == "values":
                    br.tensors.append(self.three_way(ea, ef, eb, bd, run, seen))
                    continue
            res, mode, unit, tol = self._begin(ea, eb, bd, run, memo)
            br.tensors.append(res)
            if mode is None:
                continue
            if mode == "values" and small is not None and small.add(res, ea, eb, tol, unit, bd, run):
                continue
            self._stream(res, ea, eb, bd, run, mode, unit, tol, progress, verify)
        return br

    def conclude(self, bd: Boundary, br: BoundaryResult, ents_a: Mapping[str, Entry], ents_b: Mapping[str, Entry],
                 run: dict, *, floor: Mapping[str, Entry] | None = None, seen: "Seen | None" = None) -> BoundaryResult:
        """A measured boundary's probes, tie rule and status. In the numeric pass a generated
        token's scores take the verdict of the logits they are a row of (`Contract.scores_source`),
        and their tie floor the floor run's error on that tensor's largest row."""
        self.probe(bd, br, ents_a, ents_b)
        scores_ok = min_err = None
        if self.floor_rule is not None and seen is not None:
            scores_ok, min_err = seen.sourced_verdicts(self.contract, br.tensors), seen.sourced_tie_errors(self.contract, br.tensors)
        if self.floor_rule is not None and floor:
            # the scores behind a choice, in the numeric pass: against the floor run's error there,
            # not a flat low-precision tolerance (`floor.scores_verdict`)
            # and how close a tie must be, never closer than the floor run's error on its largest
            # row (one row's error is one sample of a right route's rounding: FP4-rounded indexer
            # scores leave rows a right route gets nearly right beside rows it gets 20x worse)
            scores_ok, min_err = dict(scores_ok or {}), dict(min_err or {})
            for t in br.tensors:
                n = t.name
                if t.mode == "scores" and n in ents_a and n in ents_b and n in floor \
                        and ents_a[n].shape == ents_b[n].shape == floor[n].shape and ents_a[n].dtype.is_float:
                    v = floors.scores_verdict(ents_a[n], floor[n], ents_b[n], self.floor_rule) \
                        if n not in scores_ok else None
                    if v is not None:
                        scores_ok[n] = v
                    if n not in min_err:
                        min_err[n] = floors.worst_row_max_abs(ents_a[n], floor[n])
        ties.settle(br.tensors, ents_a, ents_b, bd.layout, run, lambda unit: self.tolerance(bd.name, unit), floor,
                    scores_ok, min_err)
        br.status, br.reason = settle(br.tensors)
        if seen is not None:
            seen.judged.update((t.name, t) for t in br.tensors)
        return br

    def probe(self, bd: Boundary, br: BoundaryResult, ents_a: Mapping[str, Entry],
              ents_b: Mapping[str, Entry]) -> None:
        """Run `bd`'s probes on each side alone. A probe that holds on A (the reference) and fails
        on B makes a tensor that matched in value diverge: a mislabelled tensor close in value."""
        by = {t.name: t for t in br.tensors}
        for name in bd.probes:
            probe = PROBES[name]  # the contract was refused at build time if it is not there
            pa = probe.check(dict(ents_a), by, "a")
            pb = probe.check(dict(ents_b), by, "b")
            for tname, t in by.items():
                if tname not in pa or tname not in pb:
                    continue
                (oka, _), (okb, detail) = pa[tname], pb[tname]
                t.probes[name] = {"a": oka, "b": okb, "detail": detail}
                if oka and not okb and t.status == "match":
                    t.status, t.reason = "diverged", f"probe {name} fails on B only ({detail})"


@dataclass
class Seen:
    """What one walk has judged so far, for the rules that read earlier boundaries: a decode
    step's family floor (`floor.row_family`), a generated token's sourced verdict and tie floor.
    `ref` and `floor` are the reference and floor-run dumps (anything with `names` and `entry`)."""
    ref: object | None = None
    floor: object | None = None
    families: dict = field(default_factory=dict)  # tensor -> its floor run's largest row RMSE
    judged: dict = field(default_factory=dict)  # tensor -> its TensorResult
    tie_errs: dict = field(default_factory=dict)  # family -> max |F - R| on the floor's largest row

    def sourced_verdicts(self, contract: Contract, tensors: list[TensorResult]) -> dict[str, tuple[bool, str]]:
        """scores name -> (right?, why) for scores that are a row of a tensor judged already."""
        source = getattr(contract, "scores_source", None)
        out: dict[str, tuple[bool, str]] = {}
        for t in tensors if source is not None else ():
            src = source(t.name) if t.mode == "scores" else None
            if src in self.judged:
                s = self.judged[src]
                out[t.name] = (s.status in PASSING, f"`{src}` {s.status}: {s.reason}" if s.reason else f"`{src}` {s.status}")
        return out

    def sourced_tie_errors(self, contract: Contract, tensors: list[TensorResult]) -> dict[str, float]:
        """scores name -> the least error its tie floor takes: for scores that are a row of a decode
        step's logits (or of the prompt's), the floor run's largest element error on its largest
        prompt row, the row a step is judged against (`floor.row_family`)."""
        source = getattr(contract, "scores_source", None)
        out: dict[str, float] = {}
        if source is None or self.ref is None or self.floor is None:
            return out
        for t in tensors:
            src = source(t.name) if t.mode == "scores" else None
            fam = (floors.row_family(src) or src) if src else None
            if fam is None or fam not in self.ref.names or fam not in self.floor.names:
                continue
            if fam not in self.tie_errs:
                self.tie_errs[fam] = floors.worst_row_max_abs(self.ref.entry(fam), self.floor.entry(fam))
            out[t.name] = self.tie_errs[fam]
        return out


class Waiting:
    """Small float pairs waiting for one native call (`batch.SmallBatch`), and the results they
    fill when it runs: when it holds BATCH_BYTES, at `run()`, or when the block ends.

        with judge.waiting() as small:
            br = judge.measure(bd, ents_a, ents_b, run, small=small)   # ... more boundaries
        judge.conclude(bd, br, ents_a, ents_b, run)
    """

    def __init__(self, judge: Judge, progress: Progress | None = None):
        self.judge, self.progress = judge, progress
        self.batch = SmallBatch()
        self.pending: list = []

    def add(self, res: TensorResult, ea: Entry, eb: Entry, tol: Tolerance, unit: DType, bd: Boundary,
            run: dict) -> bool:
        if not self.batch.add(ea.stored, eb.stored, tol, unit, ea.shape):
            return False
        self.pending.append((res, ea, eb, tol, bd, run))
        if self.batch.full:
            self.run()
        return True

    def run(self) -> None:
        """Measure every waiting pair (one native call) and settle its result."""
        judge, progress = self.judge, self.progress
        for (res, ea, eb, tol, bd, run), (I, D, bins, rows, values) in zip(self.pending, self.batch.run()):
            r = res.metrics = float_result(I, D, bins, res.dtype["unit"])
            material, why = float_verdict(r, tol, I)
            worst = I[FIRST_BAD] if I[MISMATCH] else I[WORST]
            judge._settle(res, ea, eb, bd, run, material, why, worst, rows, values)
            if progress:
                progress(ea.stored.nbytes + eb.stored.nbytes)
        self.pending.clear()

    def __enter__(self) -> "Waiting":
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            if exc_type is None and self.pending:
                self.run()
        finally:
            self.pending.clear()
            self.batch.close()


def boundary_dtypes(boundary: str, run: dict | None) -> tuple[str, ...]:
    """The float compute dtypes a run declares for `boundary` (`run.boundary_dtypes`)."""
    import fnmatch

    table = (run or {}).get("boundary_dtypes")
    if not isinstance(table, dict):
        return ()
    return tuple(v for k, v in table.items() if isinstance(v, str) and v in BY_NAME and BY_NAME[v].is_float
                 and fnmatch.fnmatchcase(boundary, k))


def settle(tensors: list[TensorResult]) -> tuple[str, str]:
    """A boundary's (status, reason) from its tensors."""
    statuses = {t.status for t in tensors}
    if statuses == {"skipped"}:  # every tensor empty: the boundary was not compared either
        return "skipped", "; ".join(f"{t.name}: {t.reason}" for t in tensors)
    for s in SETTLE_ORDER:
        if s in statuses:
            return s, "; ".join(f"{t.name}: {t.reason}" for t in tensors if t.status == s)
    return "match", ""


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """np.unravel_index of a C-order flat index, in Python (~1 us, not ~5, for a small shape)."""
    idx = []
    for s in reversed(shape):
        flat, i = divmod(flat, s)
        idx.append(i)
    return tuple(reversed(idx))


def _values_at(ea: Entry, eb: Entry, flat: int) -> dict:
    out = {}
    for side, e in (("a", ea), ("b", eb)):
        value_at = getattr(e.stored, "value_at", None)  # a StoredTensor reads one element in place
        if value_at is not None:
            out[side] = value_at(flat)
            continue
        r = e.stored.reader()  # other stored forms (a merged sharded tensor): through a reader
        try:
            x = r.read(flat, flat + 1)
        finally:
            r.close()
        out[side] = float(to_float64(x, e.dtype)[0]) if e.dtype.is_float else int(x[0])
    return out
