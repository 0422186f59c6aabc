"""Stage replay: a stage that reads its input in the wrong layout (a pad in the wrong place, a
transposed grid) does not move its OUTPUT rows anywhere A has them: every output row mixes
several input rows. So the hypothesis is tested where it lives, at the stage's input: the
engine's own stage (the one under test, fault and all; `ModelAdapter.stages`, as local error
runs it) is fed A's input re-laid by a row map of the input's grid. When that reproduces A's
output, the engine's stage reads its input through the inverse of that map. Only root boundaries
that no direct hypothesis explains are replayed, through stages that regroup rows, each
candidate one stage call."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tensordiff.judge.contract import ancestors, topological
from tensordiff.format.dtypes import to_float64
from tensordiff.format.dump import open_dump
from tensordiff.judge.diagnosis.finding import MIN_EXPLAINED, Finding, explained
from tensordiff.judge.diagnosis.row_maps import (  # only for a root left unexplained: a passing case never loads them
    ZERO, grid_maps,
)

MAX_REPLAYS = 16  # stage calls per boundary


def _numpy(entry) -> np.ndarray:
    r = entry.stored.reader()
    try:
        raw = r.read(0, entry.stored.numel)
    finally:
        r.close()
    return to_float64(raw, entry.dtype).reshape(entry.shape)


def _torch(entry, values: np.ndarray | None = None):
    import torch

    if values is None:
        r = entry.stored.reader()
        try:
            raw = r.read(0, entry.stored.numel).reshape(entry.shape)
        finally:
            r.close()
        if entry.dtype.name == "bfloat16":
            return torch.from_numpy(raw.view("int16").copy()).view(torch.bfloat16)
        return torch.from_numpy(raw.copy())
    t = torch.from_numpy(values.astype(np.float32))
    return t.to(torch.bfloat16) if entry.dtype.name == "bfloat16" else t.to(getattr(torch, entry.dtype.name))


def replay_roots(adapter, req, oracle_dir: str | Path, engine_dir: str | Path, report, make_stages=None) -> None:
    """Add stage findings to the report's root boundaries whose diagnosis is empty. A replay that
    fails is a note in the report; it never costs the comparison its verdict."""
    try:
        _replay(adapter, req, oracle_dir, engine_dir, report, make_stages)
    except Exception as e:
        report.notes.append(f"the stage replay of the diagnosis failed ({type(e).__name__}: {str(e)[:200]})")


def _replay(adapter, req, oracle_dir, engine_dir, report, make_stages) -> None:
    todo = [b for b in report.boundaries if b.root and b.diagnosis == []]
    if not todo or (make_stages is None and adapter.stages is None):
        return
    od, ed = open_dump(oracle_dir), open_dump(engine_dir)
    contract = adapter.contract
    by_name = {e.name: e for e in od.entries}
    eng = {e.name: e for e in ed.entries}
    bounds = topological(contract.resolve(list(dict.fromkeys(
        contract.boundary_of(e.name) if contract.boundary_of else e.boundary for e in od.entries))))
    by = {b.name: b for b in bounds}
    ents: dict[str, list] = {}
    for e in od.entries:
        ents.setdefault(contract.boundary_of(e.name) if contract.boundary_of else e.boundary, []).append(e)
    stages = None
    for br in todo:
        bd = by.get(br.name)
        if bd is None or not bd.inputs:
            continue
        outs = [t.name for t in br.tensors if t.status == "diverged" and t.name in by_name and t.name in eng]
        regrouped = [e for i in bd.inputs for e in ents.get(i, []) if e.dtype.is_float and e.shape
                     and any(by_name[n].shape[:1] != e.shape[:1] for n in outs)]
        if not outs or not regrouped:
            continue
        if stages is None:  # the engine's stages are built (weights loaded) only when one is replayed
            stages = (make_stages or adapter.stages())(req, od.run)
        stage = stages.get(br.name)
        if stage is None:
            continue
        want = {n: _numpy(by_name[n]) for n in outs}
        err = {n: float(((_numpy(eng[n]) - want[n]) ** 2).sum()) for n in outs}
        upstream = [x.name for x in bounds if x.name in ancestors(bounds, br.name) and x.name in ents]
        base = {e.name: _torch(e) for i in upstream for e in ents[i]}
        best: Finding | None = None
        calls = 0
        for inp in bd.inputs:
            ib = by.get(inp)
            if ib is None:
                continue
            for e in ents.get(inp, []):
                # only a stage that regroups rows (cells from patches): through a row-aligned one a
                # misread input shows as rows moved at its output, which the direct hypotheses see
                if e not in regrouped:
                    continue
                x = _numpy(e).reshape(e.shape[0], -1)
                for m in grid_maps(ib.layout, e.shape[0], od.run):
                    if not m.reads or calls >= MAX_REPLAYS:
                        continue
                    calls += 1
                    src = m.src(np.arange(x.shape[0]))
                    z = np.where((src >= 0)[:, None], x[np.clip(src, 0, None)], 0.0)
                    z[src == ZERO] = 0.0
                    try:
                        got = stage({**base, e.name: _torch(e, z.reshape(e.shape))})
                    except Exception:  # a stage that cannot take the re-laid input says nothing
                        continue
                    res = 0.0
                    for n in outs:
                        g = got.get(n) if isinstance(got, dict) else None
                        if g is None or tuple(g.shape) != want[n].shape:
                            res = float("inf")
                            break
                        res += float(((g.detach().float().cpu().numpy().astype(np.float64) - want[n]) ** 2).sum())
                    share = explained(sum(err.values()), res)
                    if share >= MIN_EXPLAINED and (best is None or share > best.explained):
                        best = Finding(", ".join(outs), "stage", m.name,
                                       f"B's `{br.name}` stage {m.reads}: fed A's `{e.name}` re-laid to undo that, "
                                       f"the engine's own stage reproduces A's `{br.name}`", share)
        if best is not None:
            br.diagnosis = [best.as_json()]
