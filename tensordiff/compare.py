"""Comparing two dumps: tensors streamed in chunks, verdicts per boundary, roots on the DAG.

    report = compare_dumps("dumps/oracle", "dumps/engine")
    report.verdict      # "match" | "diverged"
    report.earliest     # root boundaries: diverged while all their inputs match

A is the reference (usually the oracle), B the candidate (usually the engine).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from . import registry, stream, ties
from .contract import Boundary, Contract, chain, topological
from .dtypes import BY_NAME, narrower
from .dump import Dump, Entry, open_dump
from .errors import BadInput, IncomparableDumps
from .layout import describe
from .metrics import ExactMetrics, FloatMetrics, TopKSetMetrics
from .result import FAILING, BoundaryResult, Report, TensorResult
from .tolerance import Tolerances
from .tolerance import load as load_tolerances
from .tolerance import with_contract

CHUNK = 1 << 20  # elements per side per step: ~4 MB of fp32, bounded whatever the tensor size

Progress = Callable[[int], None]  # called with bytes consumed (both sides)


def compare_tensor(ea: Entry, eb: Entry, boundary: Boundary, contract: Contract, tols: Tolerances,
                   run: dict, progress: Progress | None = None, verify: bool = False,
                   run_dtypes: tuple[str, ...] = ()) -> TensorResult:
    da, db = ea.dtype, eb.dtype
    res = TensorResult(ea.name, boundary.name, "match", dtype={"a": da.name, "b": db.name},
                       shape={"a": list(ea.shape), "b": list(eb.shape)})
    if ea.shape != eb.shape:
        res.status, res.reason = "incomparable", f"shape {list(ea.shape)} vs {list(eb.shape)}"
        return res
    if da.is_float != db.is_float:
        res.status, res.reason = "incomparable", f"{da.name} vs {db.name} (float vs integer)"
        return res
    mode = contract.mode_for(ea.name) or ("values" if da.is_float else "exact")
    res.mode = mode
    if da.is_float:
        # A tensor stored in fp32 by a bf16 run (router weights, logits) carries bf16 error:
        # judge it in the narrowest of the two dtypes and the runs' declared compute dtypes.
        unit = narrower(da, db)
        for name in run_dtypes:
            if name in BY_NAME and BY_NAME[name].is_float:
                unit = narrower(unit, BY_NAME[name])
        res.dtype["unit"] = unit.name
        tol = tols.for_(boundary.name, unit.name)
        if mode == "scores":
            # the ranking key behind a top-k choice: not judged as values (-inf marks candidates not
            # eligible, and a near-tie makes no error material); the tie rule reads it (`ties`)
            res.tolerance = tol.as_dict()
            res.reason = "the scores behind this boundary's choice (read by the tie rule)"
            return res
        acc = FloatMetrics(da, db, unit, tol, ea.shape) if mode == "values" else ExactMetrics(da, db)
    else:
        tol = tols.for_(boundary.name, "int")
        k = ea.shape[-1] if ea.shape else 1
        acc = TopKSetMetrics(k, tol) if mode == "topk-sets" else ExactMetrics(da, db)
    res.tolerance = tol.as_dict()
    n = ea.stored.numel
    row = ea.shape[-1] if mode == "topk-sets" and ea.shape else (int(np.prod(ea.shape[1:])) if len(ea.shape) >= 2 else 0)
    ha, hb = stream.sha256_pair(verify, ea.sha256, eb.sha256)
    acc = stream.stream_pair(ea.stored, eb.stored, acc, stream.chunk_len(row), progress=progress, hashes=(ha, hb))
    for h, ent, side in ((ha, ea, "A"), (hb, eb, "B")):
        if h and h.hexdigest() != ent.sha256:
            raise BadInput(f"{ent.stored.file}: tensor {ent.name!r} (side {side}) fails its sha256: the file is corrupt")
    res.metrics = acc.result()
    material, why = acc.verdict()
    if material:
        res.status, res.reason = "diverged", why
    worst = acc.worst
    if worst >= 0 and n:
        idx = tuple(int(i) for i in np.unravel_index(worst, ea.shape)) if ea.shape else ()
        res.worst = {"index": list(idx), "meaning": describe(boundary.layout, idx, run)}
        res.worst.update(_values_at(ea, eb, worst))
    if isinstance(acc, FloatMetrics) and acc.rows is not None:
        res.row_error = acc.rows.tolist()
    return res


def _values_at(ea: Entry, eb: Entry, flat: int) -> dict:
    from .dtypes import to_float64

    out = {}
    for side, e in (("a", ea), ("b", eb)):
        r = e.stored.reader()
        try:
            v = to_float64(r.read(flat, flat + 1), e.dtype)[0] if e.dtype.is_float else int(r.read(flat, flat + 1)[0])
        finally:
            r.close()
        out[side] = float(v) if e.dtype.is_float else v
    return out


# ----------------------------------------------------------------------------- probes

def _probe(dump: Dump, names: list[str], probe: str) -> tuple[bool, str] | None:
    ents = {n: dump.entry(n) for n in names if n in dump.names}
    if probe == "unit-circle":
        cos = next((e for n, e in ents.items() if n.endswith(".cos")), None)
        sin = next((e for n, e in ents.items() if n.endswith(".sin")), None)
        if not cos or not sin or cos.shape != sin.shape:
            return None
        err = 0.0
        rc, rs = cos.stored.reader(), sin.stored.reader()
        try:
            from .dtypes import to_float64

            for s in range(0, cos.stored.numel, CHUNK):
                e = min(cos.stored.numel, s + CHUNK)
                c = to_float64(rc.read(s, e), cos.dtype)
                si = to_float64(rs.read(s, e), sin.dtype)
                err = max(err, float(np.nanmax(np.abs(c * c + si * si - 1))) if c.size else 0.0)
        finally:
            rc.close()
            rs.close()
        bound = 8 * narrower(cos.dtype, sin.dtype).unit_roundoff + 1e-6
        return err <= bound, f"max |cos²+sin²−1| = {err:.3g}"
    return None


def _range_probe(res: TensorResult, side: str) -> tuple[bool, str] | None:
    rng = (res.metrics.get("range") or {}).get(side)
    if not rng:
        return None
    lo, hi = rng
    return (lo >= -1 - 1e-6 and hi <= 1 + 1e-6), f"values in [{lo:.4g}, {hi:.4g}]"


# ----------------------------------------------------------------------------- dumps

def resolve_contract(da: Dump, db: Dump, contract: Contract | None) -> tuple[Contract, list[Boundary]]:
    contract = contract or registry.contract(da.model)
    order: dict[str, None] = {}
    for d in (da, db):
        for e in d.entries:
            order.setdefault(_boundary_name(contract, e), None)
    names = list(order)
    if contract is None:
        contract = chain(da.model, names)
    return contract, topological(contract.resolve(names))


def _boundary_name(contract: Contract | None, e: Entry) -> str:
    if contract is not None and contract.boundary_of is not None:
        return contract.boundary_of(e.name)
    return e.boundary


def compare_dumps(a: str | Path | Dump, b: str | Path | Dump, tolerances: Tolerances | str | Path | None = None,
                  *, contract: Contract | None = None, fail_fast: bool = False, verify: bool = False,
                  progress: Progress | None = None, floor: str | Path | Dump | None = None) -> Report:
    """`floor`: the oracle's own run in the candidate's precision (A's model, same inputs), when
    there is one: the tie rule then sets how close a near-tie must be by ITS error against A."""
    da = a if isinstance(a, Dump) else open_dump(a)
    df = floor if isinstance(floor, Dump) or floor is None else open_dump(floor)
    floor_entries = {e.name: e for e in df.entries} if df is not None else None
    db = b if isinstance(b, Dump) else open_dump(b)
    if da.path.resolve() == db.path.resolve():
        raise BadInput(f"the same directory was given twice ({da.path}); compare two different dumps")
    if da.model != db.model:
        raise IncomparableDumps(f"{da.path} is a {da.model!r} dump but {db.path} is a {db.model!r} dump: "
                                "their boundary contracts differ, so they cannot be compared")
    tols = tolerances if isinstance(tolerances, Tolerances) else load_tolerances(tolerances)
    contract, bounds = resolve_contract(da, db, contract)
    tols = with_contract(tols, contract.tolerances)
    run = da.run or db.run
    run_dtypes = tuple(d.run.get("dtype") for d in (da, db) if isinstance(d.run.get("dtype"), str))
    by_b: dict[str, tuple[list[Entry], list[Entry]]] = {}
    for side, d in ((0, da), (1, db)):
        for e in d.entries:
            by_b.setdefault(_boundary_name(contract, e), ([], []))[side].append(e)

    present = [bd for bd in bounds if bd.name in by_b]
    results: dict[str, BoundaryResult] = {}
    stop = False
    for bd in present:
        ents_a, ents_b = by_b[bd.name]
        br = BoundaryResult(bd.name, "match", meaning=bd.meaning, layout=bd.layout)
        results[bd.name] = br
        if stop:
            br.status = "skipped"
            continue
        names_a = {e.name: e for e in ents_a}
        names_b = {e.name: e for e in ents_b}
        for name in list(names_a) + [n for n in names_b if n not in names_a]:
            if name not in names_a or name not in names_b:
                side = "B" if name in names_a else "A"
                br.tensors.append(TensorResult(name, bd.name, "missing", reason=f"not in {side}"))
                continue
            br.tensors.append(compare_tensor(names_a[name], names_b[name], bd, contract, tols, run, progress, verify,
                                             run_dtypes=run_dtypes))
        _apply_probes(bd, br, da, db, list(names_a), list(names_b))
        ties.settle(br.tensors, names_a, names_b, bd.layout, run,
                    lambda unit, bd=bd: tols.for_(bd.name, unit), floor_entries)
        settle_status(br)
        if fail_fast and br.status in FAILING:
            stop = True
    _assign_roots(bounds, present, results)
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
    return Report(str(da.path), str(db.path), da.model, [results[b.name] for b in present], notes,
                  {"a": da.producer, "b": db.producer}, {"a": da.run, "b": db.run}, tols.origin)


def settle_status(br) -> None:
    """A boundary's status from its tensors': the worst failing one, else `benign` when a top-k
    flipped only on near-ties, else match."""
    statuses = [t.status for t in br.tensors]
    for s in ("incomparable", "missing", "diverged", "benign"):
        if s in statuses:
            br.status = s
            br.reason = "; ".join(f"{t.name}: {t.reason}" for t in br.tensors if t.status == s)
            return


def _apply_probes(bd: Boundary, br: BoundaryResult, da: Dump, db: Dump, na: list[str], nb: list[str]) -> None:
    for probe in bd.probes:
        if probe == "within-unit":
            for t in br.tensors:
                if t.metrics.get("range"):
                    pa, pb = _range_probe(t, "a"), _range_probe(t, "b")
                    t.probes[probe] = {"a": pa and pa[0], "b": pb and pb[0], "detail": pb and pb[1]}
                    if pa and pb and pa[0] and not pb[0] and t.status == "match":
                        t.status, t.reason = "diverged", f"probe {probe} fails on B only ({pb[1]})"
        elif probe == "unit-circle":
            pa, pb = _probe(da, na, probe), _probe(db, nb, probe)
            if pa and pb:
                for t in br.tensors:
                    t.probes[probe] = {"a": pa[0], "b": pb[0], "detail": pb[1]}
                if pa[0] and not pb[0] and br.tensors and all(t.status == "match" for t in br.tensors):
                    br.tensors[0].status, br.tensors[0].reason = "diverged", f"probe {probe} fails on B only ({pb[1]})"


def _assign_roots(bounds: list[Boundary], present: list[Boundary], results: dict[str, BoundaryResult]) -> None:
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

    for b in present:
        br = results[b.name]
        br.inputs = effective_inputs(b, set())
        if br.status not in FAILING:
            continue
        if any(results[i].status in FAILING + ("consequent",) for i in br.inputs):
            if br.status == "diverged":
                br.status = "consequent"
        elif br.status == "diverged" and any(results[i].status in ("benign", "cascade") for i in br.inputs):
            # fed by a choice that flipped on a near-tie: the difference end to end is that flip's
            # cascade, shown as information; the stage itself is judged by local error (the
            # engine's stage on the reference's tensors, the reference's choice included)
            br.status = "cascade"
        else:
            br.root = True


def required_tolerance(report: Report) -> dict[str, float]:
    """The smallest atol (with rtol = 0) under which each diverged float tensor would pass."""
    out = {}
    for b in report.boundaries:
        for t in b.tensors:
            if t.status in ("diverged",) and "max_abs" in t.metrics:
                out[t.name] = t.metrics["max_abs"]
    return out
