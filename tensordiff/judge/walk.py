"""Comparing two dumps: tensors streamed in chunks, verdicts per boundary, roots on the DAG.

    report = walk_dumps(open_dump("dumps/oracle"), open_dump("dumps/engine"), contract=...)
    report.verdict      # "match" | "diverged"
    report.earliest     # root boundaries: diverged while all their inputs match

A is the reference (usually the oracle), B the candidate (usually the engine). The walk takes the
contract it is given (a dump's model's contract is found by `tensordiff.pipeline.compare`, which
users call as `tensordiff.compare_dumps`); with none, the boundaries form a chain in file order.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from pathlib import Path
from typing import Callable

from tensordiff.judge import rank_check
from tensordiff.judge.contract import Boundary, Contract, chain, topological
from tensordiff.format.dump import Dump, Entry, open_dump
from tensordiff.errors import BadInput, IncomparableDumps
from tensordiff.judge.judge import Judge
from tensordiff.judge.metrics import FloatResult
from tensordiff.format.plain import adopt, open_any
from tensordiff.judge.result import FAILING, BoundaryResult, Report
from tensordiff.format.storage import shared_files
from tensordiff.judge.tolerance import Tolerances
from tensordiff.judge.diagnosis import diagnose_report

Progress = Callable[[int], None]  # called with bytes consumed (both sides)


# ----------------------------------------------------------------------------- dumps

_gc_lock = threading.Lock()
_gc_depth = [0, None]  # comparisons running (threads may overlap), the thresholds before the first


@contextlib.contextmanager
def _few_collections():
    """The cyclic GC less often while a comparison runs: thousands of tensors leave thousands of
    live results (nothing cyclic per tensor), and the default thresholds traverse them again and
    again (~20% of a 20,000-tensor comparison). Reference counting still frees everything else.
    Overlapping comparisons (threads) restore the thresholds when the last one ends."""
    with _gc_lock:
        if _gc_depth[0] == 0:
            _gc_depth[1] = old = gc.get_threshold()
            gc.set_threshold(max(old[0], 50_000), *old[1:])
        _gc_depth[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth[0] -= 1
            if _gc_depth[0] == 0:
                gc.set_threshold(*_gc_depth[1])


def resolve_contract(da: Dump, db: Dump, contract: Contract | None) -> tuple[Contract, list[Boundary]]:
    order: dict[str, None] = {}
    for d in (da, db):
        for e in d.entries:
            order.setdefault(boundary_name(contract, e), None)
    names = list(order)
    if contract is None:
        contract = chain(da.model, names)
    return contract, topological(contract.resolve(names))


def boundary_name(contract: Contract | None, e: Entry) -> str:
    if contract is not None and contract.boundary_of is not None:
        return contract.boundary_of(e.name)
    return e.boundary


def open_pair(a: str | Path | Dump, b: str | Path | Dump) -> tuple[Dump, Dump]:
    """Both sides opened (a dump, or plain safetensors: against a named model's dump, that model's)."""
    da = a if isinstance(a, Dump) else open_any(a)
    db = b if isinstance(b, Dump) else open_any(b)
    return adopt(da, db)


def walk_dumps(a: str | Path | Dump, b: str | Path | Dump,
               tolerances: Judge | Tolerances | str | Path | None = None, *, contract: Contract | None = None,
               fail_fast: bool = False, verify: bool = False, progress: Progress | None = None,
               floor: str | Path | Dump | None = None, diagnose: bool = True) -> Report:
    """Compare every boundary of A and B. `tolerances` is the user's (a file, a `Tolerances`), or
    a ready `Judge` (then its contract is the contract): the pipeline passes the judge it also
    hands to local error, so both routes judge a tensor alike. `floor`: the oracle's own run in
    B's precision, when there is one: the tie rule then sets how close a near-tie must be by ITS
    error against A. `diagnose`: test layout/scale hypotheses on the root boundaries
    (`tensordiff.judge.diagnosis`)."""
    da, db = open_pair(a, b)
    df = floor if isinstance(floor, Dump) or floor is None else open_dump(floor)
    floor_entries = {e.name: e for e in df.entries} if df is not None else None
    if da.path.resolve() == db.path.resolve():
        raise BadInput(f"the same directory was given twice ({da.path}); compare two different dumps")
    if da.model != db.model:
        raise IncomparableDumps(f"{da.path} is a {da.model!r} dump but {db.path} is a {db.model!r} dump: "
                                "their boundary contracts differ, so they cannot be compared")
    if not da.entries and not db.entries:  # "all 0 boundaries match" would be a pass by accident
        raise BadInput(f"nothing to compare: {da.path} and {db.path} hold no tensors (did the producer record "
                       "any boundary?)")
    judge = tolerances if isinstance(tolerances, Judge) else None
    contract, bounds = resolve_contract(da, db, judge.contract if judge else contract)
    if judge is None:
        judge = Judge.build(contract, tolerances, run_dtypes=(da.run.get("dtype"), db.run.get("dtype")))
    run = da.run or db.run
    by_b: dict[str, tuple[list[Entry], list[Entry]]] = {}
    for side, d in ((0, da), (1, db)):
        for e in d.entries:
            by_b.setdefault(boundary_name(contract, e), ([], []))[side].append(e)

    present = [bd for bd in bounds if bd.name in by_b]
    results: dict[str, BoundaryResult] = {}
    stop = False
    # Without --fail-fast or a sharded side, every boundary is measured first and concluded after:
    # the small float tensors of all of them wait together for few native calls (a boundary of
    # two or three tensors, times thousands, made as many calls). Boundary by boundary otherwise:
    # --fail-fast stops at the first failing one, and a rank check reads a concluded boundary.
    staged = not fail_fast and not (da.world or db.world)
    with shared_files(), _few_collections():  # each tensor file mapped once for the whole comparison
        if staged:
            measured = []
            with judge.waiting(progress) as small:
                for bd in present:
                    ents_a, ents_b = ({e.name: e for e in ents} for ents in by_b[bd.name])
                    measured.append((bd, ents_a, ents_b, judge.measure(bd, ents_a, ents_b, run, progress=progress,
                                                                       verify=verify, small=small)))
            for bd, ents_a, ents_b, br in measured:
                results[bd.name] = judge.conclude(bd, br, ents_a, ents_b, run, floor=floor_entries)
        for bd in present if not staged else ():
            if stop:
                results[bd.name] = BoundaryResult(bd.name, "skipped", meaning=bd.meaning, layout=bd.layout)
                continue
            ents_a, ents_b = ({e.name: e for e in ents} for ents in by_b[bd.name])
            br = results[bd.name] = judge.boundary(bd, ents_a, ents_b, run, progress=progress, verify=verify,
                                                   floor=floor_entries)
            if da.world or db.world:  # a sharded side: replicas must agree, a diverged shard is placed
                rank_check.check(br, judge, bd, ents_a, ents_b, run, verify)
            if fail_fast and br.status in FAILING:
                stop = True
    assign_roots(bounds, present, results)
    report_rows = [results[b.name] for b in present]
    notes = [f"{d.path} is a sharded run of {d.world} ranks, merged" for d in (da, db) if d.world]
    if diagnose and any(r.root for r in report_rows):  # only roots are diagnosed: no import without one

        notes += diagnose_report(report_rows, da, db, contract, bounds)
    if da.producer.get("side") and da.producer.get("side") == db.producer.get("side"):
        notes.append(f"both dumps come from the {da.producer['side']} side")
    for k in ("dtype", "device"):
        va, vb = da.run.get(k), db.run.get(k)
        if va and vb and va != vb:
            notes.append(f"{k} differs: A {va}, B {vb}")
    for k in ("inputs", "weights"):
        va, vb = da.run.get(k), db.run.get(k)
        if k == "inputs" and isinstance(va, dict) and isinstance(vb, dict):
            va, vb = va.get("sha256") or va.get("image", {}), vb.get("sha256") or vb.get("image", {})
        if va and vb and va != vb:
            notes.append(f"the two runs had different {k}: the comparison may be meaningless")
    return Report(str(da.path), str(db.path), da.model, report_rows, notes,
                  {"a": da.producer, "b": db.producer}, {"a": da.run, "b": db.run}, judge.tolerances.origin)


def assign_roots(bounds: list[Boundary], present: list[Boundary], results: dict[str, BoundaryResult]) -> None:
    """A failing boundary is a root when every present input (seen through absent ones) matches."""
    by = {b.name: b for b in bounds}

    def effective_inputs(b: Boundary, seen: set[str]) -> list[str]:
        out: list[str] = []
        for i in b.inputs:
            if i in seen:
                continue
            seen.add(i)
            if i in results:
                out.append(i)
            elif i in by:
                out.extend(effective_inputs(by[i], seen))
        return out

    after_flip: set[str] = set()  # boundaries downstream of a top-k choice that flipped on a near-tie
    for b in present:
        br = results[b.name]
        br.inputs = effective_inputs(b, set())
        if br.status == "benign" or any(i in after_flip for i in br.inputs):
            after_flip.add(b.name)
        if br.status not in FAILING:
            continue
        if any(results[i].status in FAILING + ("consequent",) for i in br.inputs):
            if br.status == "diverged":
                br.status = "consequent"
        elif br.status == "diverged" and any(i in after_flip for i in br.inputs) and not rank_check.definite(br):
            # fed (through any path) by a choice that flipped on a near-tie: the difference end to
            # end is that flip's cascade, shown as information; the stage itself is judged by
            # local error (the engine's stage on the reference's tensors and choice). A rank
            # finding (replicas that differ, a misplaced shard) is no flip's cascade: it stays
            br.status = "cascade"
        else:
            br.root = True


def required_tolerance(report: Report) -> dict[str, float]:
    """The smallest atol (with rtol = 0) under which each diverged float tensor would pass."""
    out = {}
    for b in report.boundaries:
        for t in b.tensors:
            if t.status == "diverged" and isinstance(t.metrics, FloatResult):
                out[t.name] = t.metrics.max_abs
    return out
