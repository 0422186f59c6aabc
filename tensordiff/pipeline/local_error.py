"""Local error: each engine stage run on the ORACLE's tensors at its input boundaries.

End-to-end, a boundary's error is everything upstream plus its own stage. Feeding the engine's
stage the oracle's inputs isolates the stage: its output against the oracle's is the stage's own
(local) error. The earliest boundary whose local error is material is the ORIGIN, even when the
end-to-end walk names a later boundary (upstream drift within tolerance, amplified) or an
earlier one cannot be told apart.

The hook an adapter provides (optional; a third-party adapter may omit it and the report says so):

    ModelAdapter.stages: () -> make_stages            # lazy import of the engine, like `engine`
    make_stages(req: RunRequest, run: dict) -> dict[str, Stage]
    Stage(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]

A stage may say `stage.replays_run = True`: fed the engine's own recorded tensors bit for bit,
it computes what the engine's end-to-end run recorded at its boundary, bit for bit (the same code
on the same device, as the run took it). When every tensor such a stage would be fed is bit for
bit the same in the oracle's dump and the engine's (`engine_dir`: dtype, shape, sha256), its local
error IS the end-to-end error and it is not run again (the DeepSeek tower's block 0 on identical
patches and RoPE tables: half the local error's compute on the CPU).

`run` is the oracle dump's run record (`inputs.grid`, `inputs.cells`, ...). The dict is keyed by
the boundary a stage PRODUCES; `inputs` holds every oracle tensor of the boundary's contract
inputs AND of everything upstream of them (a tower's later blocks still consume the RoPE
tables), by tensor name, as stored (dtype kept, on the CPU; a read-only mapping whose tensors
are read from the dump as the stage reads them, each stage its own copies); the stage
casts and moves them as the engine would under `req` (device, dtype, backend, fault) and returns
the engine's tensors of its boundary, by tensor name. A boundary with no inputs has no stage:
its local error is its end-to-end error.
"""
from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tensordiff.format.capture import Recorder
from tensordiff.judge.contract import Contract, ancestors, topological
from tensordiff.format.dump import Dump, open_dump
from tensordiff.errors import BadInput
from tensordiff.judge.judge import Judge, Seen
from tensordiff.judge.result import Report, TensorResult, json_safe
from tensordiff.judge.tolerance import Tolerances
from tensordiff.format.dtypes import BY_NAME
from tensordiff.judge.floor import row_family
from tensordiff.judge.walk import walk

LOCAL_FAILING = ("diverged", "missing", "incomparable", "error")


@dataclass
class LocalResult:
    boundary: str
    status: str  # match | diverged | missing | incomparable | error | no-stage | no-input | derived
    reason: str = ""
    tensors: list[TensorResult] = field(default_factory=list)
    seconds: float = 0.0
    end_to_end: str = ""  # this boundary's end-to-end status, for the side-by-side
    detail: str = ""  # a short traceback when the stage raised

    @property
    def failing(self) -> bool:
        return self.status in LOCAL_FAILING

    @property
    def summary(self) -> str:
        ms = [t.metrics.get("max_abs") for t in self.tensors if isinstance(t.metrics.get("max_abs"), float)]
        if self.status in ("no-stage", "no-input", "error", "same", "derived"):
            return self.reason
        return f"max|Δ| {max(ms):.3g}" if ms else self.reason

    def as_json(self) -> dict:
        return json_safe({"boundary": self.boundary, "status": self.status, "reason": self.reason,
                        "end_to_end": self.end_to_end, "seconds": round(self.seconds, 4),
                        "tensors": [t.as_json() for t in self.tensors]})


@dataclass
class LocalReport:
    available: bool
    boundaries: list[LocalResult] = field(default_factory=list)
    note: str = ""
    earliest_end_to_end: list[str] = field(default_factory=list)

    @property
    def origin(self) -> str | None:
        """The earliest boundary (topological) whose stage alone diverges."""
        for r in self.boundaries:
            if r.failing:
                return r.boundary
        return None

    def get(self, boundary: str) -> LocalResult | None:
        for r in self.boundaries:
            if r.boundary == boundary:
                return r
        return None

    def summary(self) -> str:
        if not self.available:
            return self.note
        o = self.origin
        e2e = self.earliest_end_to_end
        missing = [r.boundary for r in self.boundaries if r.status in ("no-stage", "no-input")]
        tail = f" (no stage for {', '.join(missing)})" if missing else ""
        if o is None:
            if e2e:
                return ("every engine stage is within tolerance on the oracle's inputs: the end-to-end divergence at "
                        + ", ".join(f"`{n}`" for n in e2e)
                        + " is drift accumulated upstream within tolerance, not one stage's bug" + tail)
            return "every engine stage is within tolerance on the oracle's inputs" + tail
        r = self.get(o)
        msg = f"origin `{o}`: the engine's stage producing `{o}` {r.status} on the oracle's own inputs"
        if r.reason:
            msg += f" ({r.reason})"
        if e2e and o not in e2e:
            msg += (f"; end-to-end names {', '.join(f'`{n}`' for n in e2e)}, which the local error attributes "
                    f"to `{o}`")
        return msg + tail

    def as_json(self) -> dict:
        return {"available": self.available, "note": self.note, "origin": self.origin, "summary": self.summary(),
                "boundaries": [r.as_json() for r in self.boundaries]}


def unavailable(model: str) -> LocalReport:
    return LocalReport(False, note=f"local error not available: the {model!r} adapter exposes no engine stages "
                                   "(ModelAdapter.stages)")


def _by_boundary(d: Dump, contract: Contract) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in d.entries:
        b = contract.boundary_of(e.name) if contract.boundary_of else e.boundary
        out.setdefault(b, []).append(e)
    return out


def _to_torch(d: Dump, entry):
    import torch


    r = entry.stored.reader()
    try:
        raw = r.read(0, entry.stored.numel).reshape(entry.shape)
    finally:
        r.close()
    if entry.dtype.name == "bfloat16":  # stored as uint16 bits
        return torch.from_numpy(raw.view("int16").copy()).view(torch.bfloat16)
    assert entry.dtype.name in BY_NAME
    return torch.from_numpy(raw.copy())


class _Fed(Mapping):
    """The oracle's tensors offered to one stage (everything upstream of its boundary), each read
    and converted (`_to_torch`) when the stage first reads it: a stage reads a few of them (a
    decode step is offered the prompt's logits and reads the streams). Every stage gets its own
    copies, as before: what one stage does to its inputs never reaches another."""

    def __init__(self, d: Dump, entries):
        self._d, self._entries, self._made = d, {e.name: e for e in entries}, {}

    def __getitem__(self, name: str):
        if name not in self._made:
            self._made[name] = _to_torch(self._d, self._entries[name])
        return self._made[name]

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def _identical_inputs(b, report: Report) -> bool:
    """Every input of `b` matched end to end and is compared exactly (integer decisions such as
    the preprocessing plan): the engine's stage then saw the reference's own inputs already."""
    names = {x.name: x for x in report.boundaries}
    for i in b.inputs:
        br = names.get(i)
        if br is None or br.status != "match" or not br.tensors:
            return False
        if any(t.mode != "exact" for t in br.tensors):
            return False
    return True


def _from_end_to_end(lr: LocalResult, report: Report, reason: str) -> None:
    """`lr` takes its boundary's end-to-end result: the stage's own error is that one."""
    br = report.boundary(lr.boundary)
    lr.status = {"consequent": "diverged", "skipped": "match"}.get(br.status, br.status)
    lr.reason = reason
    lr.tensors = br.tensors


def _as_the_engine_had(fed: list, engine: dict) -> bool:
    """Every oracle tensor in `fed` is bit for bit the engine's tensor of that name (`engine`:
    name -> (dtype, shape, sha256) of the engine's dump)."""
    return bool(fed) and all(e.sha256 is not None and engine.get(e.name) == (e.dtype.name, tuple(e.shape), e.sha256)
                             for e in fed)


def _run_stage(stage, inputs: dict, lr: LocalResult, rec: Recorder) -> list[str] | None:
    """Run one engine stage on `inputs` and record what it returns under `lr`'s boundary: the
    names recorded, or None with `lr` marked `error` (an engine bug in one stage must not hide
    the others; a BadInput is the user's and propagates)."""
    t0 = time.perf_counter()
    try:
        outs = stage(inputs)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001
        lr.status, lr.reason = "error", f"the stage raised {type(e).__name__}: {e}"
        lr.seconds = time.perf_counter() - t0
        lr.detail = traceback.format_exc(limit=4)
        return None
    lr.seconds = time.perf_counter() - t0
    if not isinstance(outs, dict):
        lr.status, lr.reason = "error", f"the stage returned {type(outs).__name__}, not a dict of tensors"
        return None
    for name, t in outs.items():
        rec.record(name, t, boundary=lr.boundary)
    return list(outs)


def local_error(adapter, req, oracle_dir: str | Path, report: Report, tolerances: Judge | Tolerances | None,
                workdir: str | Path, make_stages=None, engine_dir: str | Path | None = None) -> LocalReport:
    """Run each engine stage on the oracle's tensors and compare with the oracle's outputs.

    `report` is the end-to-end report of the same case (for the side-by-side and the boundaries
    present); `workdir` receives the local dump (`<workdir>/local`). `tolerances` is the
    end-to-end route's `Judge` (the pipeline passes it), or the user's tolerances, from which the
    same judge is built: the adapter's contract, and the compute dtypes of the oracle's run and
    of the engine's request, exactly as `compare_dumps` builds it from the two dumps.
    `engine_dir`: the engine's end-to-end dump of `req`, for the stages that replay it (see the
    module's docstring: `replays_run`); without it every stage runs."""
    if make_stages is None:
        if adapter.stages is None:
            return unavailable(adapter.name)
        make_stages = adapter.stages()
    od = open_dump(oracle_dir)
    contract = adapter.contract
    judge = tolerances if isinstance(tolerances, Judge) else Judge.build(
        contract, tolerances, run_dtypes=(od.run.get("dtype"), req.dtype))
    bounds = topological(contract.resolve(list(_by_boundary(od, contract))))
    present = {b.name for b in report.boundaries}
    e2e = {b.name: b.status for b in report.boundaries}
    stages = make_stages(req, od.run)
    if not isinstance(stages, dict):
        raise TypeError(f"{adapter.name}: stages factory must return a dict boundary -> stage, not {type(stages).__name__}")
    ents = _by_boundary(od, contract)
    results: list[LocalResult] = []
    out_dir = Path(workdir) / "local"
    rec = Recorder(out_dir, model=od.model, producer={"name": "tensordiff-local", "side": "engine-stages"},
                   run=dict(od.run), overwrite=True)
    produced: dict[str, list[str]] = {}
    engine = ({e.name: (e.dtype.name, tuple(e.shape), e.sha256) for e in open_dump(engine_dir).entries}
              if engine_dir is not None else {})
    for b in bounds:
        if b.name not in present:
            continue
        lr = LocalResult(b.name, "match", end_to_end=e2e[b.name])
        results.append(lr)
        decided = b.name not in stages and _identical_inputs(b, report)
        if not b.inputs or decided:
            # nothing upstream, or only discrete decisions (the `plan`) that are identical on both
            # sides: the stage from the raw input IS the end-to-end path
            _from_end_to_end(lr, report, "first boundary: local error = end-to-end error" if not b.inputs else
                             f"its inputs ({', '.join(b.inputs)}) are identical on both sides: local error = "
                             "end-to-end error")
            continue
        stage = stages.get(b.name)
        if stage is None:
            src = next((contract.scores_source(e.name) for e in ents.get(b.name, [])
                        if contract.scores_source is not None and contract.scores_source(e.name)), None)
            # a generated token is its logits' argmax: that stage (fed the reference's tokens) is judged
            lr.status, lr.reason = (("derived", f"chosen from `{src}` (its argmax), whose stage is judged") if src
                                    else ("no-stage", "the engine exposes no stage for this boundary"))
            continue
        lacking = [i for i in b.inputs if i not in ents]
        if lacking:
            lr.status, lr.reason = "no-input", f"the oracle dump lacks input boundary {', '.join(lacking)}"
            continue
        anc = ancestors(bounds, b.name)  # once, not once per boundary it is tested against
        upstream = [x.name for x in bounds if x.name in anc and x.name in ents]
        fed = [e for i in upstream for e in ents[i]]
        if getattr(stage, "replays_run", False) and _as_the_engine_had(fed, engine):
            _from_end_to_end(lr, report, "its inputs are bit for bit the engine's own: the stage's output is the "
                                         "engine's end-to-end one, local error = end-to-end error")
            continue
        names = _run_stage(stage, _Fed(od, fed), lr, rec)
        if names is not None:
            produced[b.name] = names
    rec.close()
    ld = open_dump(out_dir)
    by = {b.name: b for b in bounds}
    judged = [by[lr.boundary] for lr in results if lr.boundary in produced]
    entries = {b: ({e.name: e for e in ents.get(b, [])}, {n: ld.entry(n) for n in produced[b]}) for b in produced}
    walked = walk(judged, entries, judge, od.run, missing=("not in the oracle dump", "the stage did not return it"))
    for lr in results:
        br = walked.get(lr.boundary)
        if br is None:
            continue
        lr.tensors = br.tensors
        if br.status != "match":
            lr.status, lr.reason = br.status, br.reason
    return LocalReport(True, results, earliest_end_to_end=report.earliest)


def decode_three_way(adapter, req, ref_dir: str | Path, floor_dir: str | Path, local: LocalReport,
                     workdir: str | Path, judge: Judge, make_stages=None) -> None:
    """The numeric pass's local error of its decode steps, judged three-way; replaces their
    verdicts in `local` (the run's engine stages on the floor run's tensors, judged by the direct
    tolerance of its dtype).

    A decode step's stage is the whole network for one token: two right bf16 routes of it differ
    by the whole network's rounding, including the step's own router and indexer choices, which
    flip on near-ties and are no boundary of their own (H200: the clean engine's step on the
    floor run's inputs left the bf16 tolerance on 3 of 10 pictures; on the CPU it equals the
    floor run's to 1e-7). So the engine's step in the run's precision (`req`) is fed the
    REFERENCE's tensors and tokens, and its error against the reference is judged as the
    numeric pass judges a decode step end to end (`floor.row_family`): a multiple of the floor
    run's error there, never below its largest row of the prompt's logits."""
    steps = [r for r in local.boundaries if row_family(r.boundary) and r.status not in ("no-stage", "no-input", "derived")]
    if not steps:
        return
    if make_stages is None:
        make_stages = adapter.stages()
    rd, fd = open_dump(ref_dir), open_dump(floor_dir)
    contract = adapter.contract
    bounds = topological(contract.resolve(list(_by_boundary(rd, contract))))
    by = {b.name: b for b in bounds}
    ents = _by_boundary(rd, contract)
    stages = make_stages(req, rd.run)
    out_dir = Path(workdir) / "local-steps"
    rec = Recorder(out_dir, model=rd.model, producer={"name": "tensordiff-local", "side": "engine-stages"},
                   run=dict(rd.run), overwrite=True)
    ran: dict[str, list[str]] = {}
    for lr in steps:
        stage = stages.get(lr.boundary)
        if stage is None or lr.boundary not in by:
            continue
        anc = ancestors(bounds, lr.boundary)
        upstream = [x.name for x in bounds if x.name in anc and x.name in ents]
        lr.tensors = []
        names = _run_stage(stage, _Fed(rd, [e for i in upstream for e in ents[i]]), lr, rec)
        if names is not None:
            ran[lr.boundary] = names
    rec.close()
    ld = open_dump(out_dir)
    if judge.floor_rule is None:
        judge = judge.numeric()
    judged = [by[lr.boundary] for lr in steps if lr.boundary in ran]
    entries = {b: ({n: rd.entry(n) for n in names if n in rd.names}, {n: ld.entry(n) for n in names})
               for b, names in ran.items()}
    walked = walk(judged, entries, judge, rd.run, floor={e.name: e for e in fd.entries}, seen=Seen(rd, fd),
                  missing=("not in the reference", "the stage did not return it"))
    for lr in steps:
        if lr.boundary not in ran:
            continue
        lr.tensors = walked[lr.boundary].tensors
        bad = [t for t in lr.tensors if t.status != "match"]
        lr.status = bad[0].status if bad else "match"
        lr.reason = ("three-way: the engine's step in " + str(req.dtype) + " on the reference's inputs, "
                     "as a multiple of the floor run's error" + (f": {bad[0].reason}" if bad else ""))
