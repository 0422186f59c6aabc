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
from typing import Callable, Mapping

from tensordiff.judge import rank_check, replay_check
from tensordiff.judge.contract import Boundary, Contract, chain, topological
from tensordiff.format.dump import Dump, Entry, open_dump
from tensordiff.errors import BadInput, IncomparableDumps
from tensordiff.judge.floor import FloorRule
from tensordiff.judge.judge import Judge, Seen
from tensordiff.judge.roots import assign_roots
from tensordiff.judge.metrics import FloatResult
from tensordiff.format.plain import adopt, open_any
from tensordiff.judge.result import FAILING, BoundaryResult, Report
from tensordiff.format.storage import shared_files
from tensordiff.judge.tolerance import Tolerances, sources_line
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
               floor: str | Path | Dump | None = None, floor_rule: FloorRule | None = None,
               profile: Mapping | None = None, diagnose: bool = True) -> Report:
    """Judge every boundary of A (reference) and B (candidate) in the contract's order, then name
    the roots. `tolerances` is the user's (a file, a `Tolerances`), or a ready `Judge` (then its
    contract is the contract): the pipeline passes the judge it also hands to local error, so both
    routes judge a tensor alike. `floor`: the oracle's own run in B's precision, when there is one:
    the tie rule then sets how close a near-tie must be by ITS error against A, and a judge with a
    floor rule (the numeric pass: `floor_rule` and the calibrated `profile`, or a `Judge.numeric`)
    judges every float tensor against it.
    `diagnose`: test layout/scale hypotheses on the root boundaries (`tensordiff.judge.diagnosis`)."""
    da, db = open_pair(a, b)
    df = floor if isinstance(floor, Dump) or floor is None else open_dump(floor)
    judge = tolerances if isinstance(tolerances, Judge) else None
    if judge is not None and floor_rule is not None:
        judge = judge.numeric(floor_rule, profile)
    numeric = floor_rule is not None or (judge is not None and judge.floor_rule is not None)
    if numeric and df is None:
        raise BadInput("the numeric pass needs the floor run: the oracle's own dump in the candidate's precision")
    _check_sides(da, db, df if numeric else None)
    contract, bounds = resolve_contract(da, db, judge.contract if judge else contract)
    if judge is None:
        judge = Judge.build(contract, tolerances, run_dtypes=(da.run.get("dtype"), db.run.get("dtype")),
                            floor_rule=floor_rule, profile=profile)
    run = {**db.run, **da.run}  # the reference's facts, the candidate's where it has none (the image span)
    by_b: dict[str, tuple[dict[str, Entry], dict[str, Entry]]] = {}
    for side, d in ((0, da), (1, db)):
        for e in d.entries:
            by_b.setdefault(boundary_name(contract, e), ({}, {}))[side][e.name] = e
    present = [bd for bd in bounds if bd.name in by_b]
    floor_entries = {e.name: e for e in df.entries} if df is not None else None
    with shared_files(), _few_collections():  # each tensor file mapped once for the whole comparison
        results = walk(present, by_b, judge, run, floor=floor_entries, seen=Seen(da, df),
                       fail_fast=fail_fast, verify=verify, progress=progress, sharded=bool(da.world or db.world))
    if numeric and not any(t.status not in ("missing", "skipped") for r in results.values() for t in r.tensors):
        raise BadInput(f"the three dumps ({da.path}, {df.path}, {db.path}) share no tensor: nothing was compared")
    assign_roots(bounds, present, results)
    report_rows = [results[b.name] for b in present]
    notes = [f"{d.path} is a sharded run of {d.world} ranks, merged" for d in (da, db) if d.world]
    if numeric:
        notes.insert(0, f"numeric pass: {db.run.get('dtype')} engine against the {da.run.get('dtype')} oracle, "
                        f"errors as multiples of the {df.run.get('dtype')} oracle's own (floor run {df.path})")
    if diagnose and any(r.root for r in report_rows):
        notes += diagnose_report(report_rows, da, db, contract, bounds)
    notes += _run_notes(da, db)
    producers = {"a": da.producer, "b": db.producer} | ({"floor": df.producer} if numeric else {})
    runs = {"a": da.run, "b": db.run} | ({"floor": df.run} if numeric else {})
    how = judgement(da, db, report_rows, df if numeric else None)
    if how["kind"] == "two-way":
        notes.insert(0, how["note"])
    return Report(str(da.path), str(db.path), da.model, report_rows, notes, producers, runs,
                  sources_line((t for b in report_rows for t in b.tensors), judge.tolerances.origin), judgement=how)


LOW_PRECISION = ("bfloat16", "float16")
TWO_WAY = ("two-way verdict: {what} computed in {dtypes} and no floor run was given, so each such tensor was judged "
           "by one flat tolerance, not against the error a right {dtypes} route makes there. It cannot see a bug "
           "of a few times that error (one wrong row or token, a stray scale) and cannot tell a right route whose "
           "error passes the flat tolerance from a bug. Give the oracle's own {dtypes} dump as --floor (with the "
           "float32 oracle as A) for the floor-relative, row-aware verdict")


def judgement(da: Dump, db: Dump, rows: list[BoundaryResult], df: Dump | None = None) -> dict:
    """How the float tensors of a comparison were judged: three-way (against the floor run `df`),
    two-way (a low-precision side, no floor: what that cannot see is said), or direct. A side is
    low precision where its run declares a bf16/fp16 compute dtype (its own or a boundary's,
    `run.boundary_dtypes`), or, undeclared, where a float tensor judged in bf16/fp16 differs at
    all (a bit-exact route stays exact: nothing there needs a floor)."""
    if df is not None:
        return {"kind": "three-way", "floor": str(df.path)}
    declared = set()
    for d in (da, db):
        declared |= {v for v in [d.run.get("dtype"), *(d.run.get("boundary_dtypes") or {}).values()]
                     if v in LOW_PRECISION}
    differing = [t for r in rows for t in r.tensors if t.mode == "values" and isinstance(t.metrics, FloatResult)
                 and t.dtype.get("unit") in LOW_PRECISION and t.metrics.max_abs != 0]
    if not declared and not differing:
        return {"kind": "direct"}
    dtypes = sorted(declared or {t.dtype["unit"] for t in differing})
    sides = [s for s, d in (("A", da), ("B", db)) if d.run.get("dtype") in LOW_PRECISION
             or any(v in LOW_PRECISION for v in (d.run.get("boundary_dtypes") or {}).values())]
    what = (f"{' and '.join(sides)} {'were' if len(sides) > 1 else 'was'}" if sides
            else f"{len(differing)} differing tensor(s) were")
    return {"kind": "two-way", "low_precision": dtypes, "tensors": [t.name for t in differing],
            "cannot_see": "a bug within a few times the low-precision error (a wrong row or token, a stray scale); "
                          "a right route's error past the flat tolerance",
            "note": TWO_WAY.format(what=what, dtypes="/".join(dtypes))}


def walk(present: list[Boundary], entries: Mapping[str, tuple[Mapping[str, Entry], Mapping[str, Entry]]],
         judge: Judge, run: dict, *, floor: Mapping[str, Entry] | None = None, seen: Seen | None = None,
         fail_fast: bool = False, verify: bool = False, progress: Progress | None = None, sharded: bool = False,
         missing: tuple[str, str] = ("not in A", "not in B")) -> dict[str, BoundaryResult]:
    """The one walk: each boundary of `present` (in the contract's order) judged by `judge` on its
    entries (A, B) and, in the numeric pass, the floor run's. Every route walks here: a direct
    comparison, the numeric pass, local error's stages and its decode steps.

    Without --fail-fast or a sharded side, every boundary is measured first and concluded after:
    the small float tensors of all of them wait together for few native calls (a boundary of two
    or three tensors, times thousands, made as many calls). Boundary by boundary otherwise:
    --fail-fast stops at the first failing one, and a rank check reads a concluded boundary."""
    seen = seen if seen is not None else Seen()
    results: dict[str, BoundaryResult] = {}
    if not fail_fast and not sharded:
        measured = []
        with judge.waiting(progress) as small:
            for bd in present:
                ents_a, ents_b = entries[bd.name]
                fl = _floor_of(floor, ents_a, ents_b)
                measured.append((bd, ents_a, ents_b, fl, judge.measure(
                    bd, ents_a, ents_b, run, progress=progress, verify=verify, small=small, missing=missing,
                    floor=fl, seen=seen)))
        for bd, ents_a, ents_b, fl, br in measured:
            results[bd.name] = judge.conclude(bd, br, ents_a, ents_b, run, floor=fl, seen=seen)
        return results
    stop = False
    for bd in present:
        if stop:
            results[bd.name] = BoundaryResult(bd.name, "skipped", meaning=bd.meaning, layout=bd.layout)
            continue
        ents_a, ents_b = entries[bd.name]
        br = results[bd.name] = judge.boundary(bd, ents_a, ents_b, run, progress=progress, verify=verify,
                                               missing=missing, floor=_floor_of(floor, ents_a, ents_b), seen=seen)
        if sharded:  # a sharded side: replicas must agree, a diverged shard is placed
            rank_check.check(br, judge, bd, ents_a, ents_b, run, verify)
        if fail_fast and br.status in FAILING:
            stop = True
    return results


def _floor_of(floor: Mapping[str, Entry] | None, ents_a: Mapping, ents_b: Mapping) -> dict[str, Entry] | None:
    """The floor run's entries of one boundary (None where there is no floor run)."""
    if floor is None:
        return None
    return {n: floor[n] for n in list(ents_a) + list(ents_b) if n in floor}


def _check_sides(da: Dump, db: Dump, df: Dump | None) -> None:
    """Two (or, with the floor run, three) dumps that can be compared at all."""
    if df is not None:
        if len({da.model, df.model, db.model}) != 1:
            raise IncomparableDumps(f"three-way comparison needs one model, got {da.model!r}, {df.model!r}, {db.model!r}")
        for d, what in ((df, "floor"), (db, "candidate")):
            if d.path.resolve() == da.path.resolve():
                raise BadInput(f"the {what} dump is the reference dump itself ({d.path})")
        return
    if da.path.resolve() == db.path.resolve():
        raise BadInput(f"the same directory was given twice ({da.path}); compare two different dumps")
    if da.model != db.model:
        raise IncomparableDumps(f"{da.path} is a {da.model!r} dump but {db.path} is a {db.model!r} dump: "
                                "their boundary contracts differ, so they cannot be compared")
    if not da.entries and not db.entries:  # "all 0 boundaries match" would be a pass by accident
        raise BadInput(f"nothing to compare: {da.path} and {db.path} hold no tensors (did the producer record "
                       "any boundary?)")


def _run_notes(da: Dump, db: Dump) -> list[str]:
    """What the two runs' own records say about the comparison."""
    notes = []
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
    notes += [n for n in (replay_check.note(d) for d in (da, db)) if n]  # decode a captured graph froze
    return notes
