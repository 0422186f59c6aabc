"""Result data: per tensor, per boundary, and the whole report. Truthy when everything matches;
`str()` is a readable summary; `as_json()` is the machine report."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

# benign: a top-k choice flipped only on near-ties (`ties`); cascade: diverged end to end, fed only
# by such a flip (information: the stage is judged by local error). Neither fails a run.
STATUSES = ("match", "diverged", "consequent", "missing", "incomparable", "skipped", "benign", "cascade")
FAILING = ("diverged", "missing", "incomparable")
PASSING = ("match", "skipped", "benign", "cascade")
# the boundary of the token fed to decode step K (both language contracts: `models.decode_tokens`)
TOKEN_STEP = re.compile(r"^token\.step\.(\d+)$")


@dataclass
class TensorResult:
    name: str
    boundary: str
    status: str  # match | diverged | missing | incomparable | skipped
    reason: str = ""
    mode: str = "values"
    dtype: dict = field(default_factory=dict)  # {"a": .., "b": .., "unit": ..}
    shape: dict = field(default_factory=dict)
    metrics: Any = field(default_factory=dict)  # a metrics.MetricResult ({} when not compared)
    tolerance: dict = field(default_factory=dict)
    worst: dict | None = None  # {"index": [...], "meaning": "...", "a": .., "b": ..}
    row_error: list | None = None  # max |a-b| per leading row (for heatmaps)
    probes: dict = field(default_factory=dict)
    ranks: dict | None = None  # a sharded side's rank check (`rank_check`): the ranks that disagree

    def __bool__(self) -> bool:
        return self.status == "match"

    def as_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "boundary", "status", "reason", "mode", "dtype", "shape",
                                             "tolerance", "worst", "probes")}
        if self.ranks is not None:
            d["ranks"] = self.ranks
        d["metrics"] = self.metrics_json()
        return json_safe(d)

    def metrics_json(self) -> dict:
        m = self.metrics
        return m.as_json() if hasattr(m, "as_json") else dict(m)


@dataclass
class BoundaryResult:
    name: str
    status: str
    root: bool = False
    inputs: list[str] = field(default_factory=list)
    tensors: list[TensorResult] = field(default_factory=list)
    reason: str = ""
    meaning: str = ""
    layout: str = "plain"
    # what kind of wrong (`tensordiff.judge.diagnosis`): None when not diagnosed, [] when no simple
    # hypothesis explains it, else Finding.as_json() dicts
    diagnosis: list | None = None

    def __bool__(self) -> bool:
        return self.status == "match"

    @property
    def look_between(self) -> str:
        if not self.inputs:
            return f"`{self.name}` is the first boundary: look at what produces it from the inputs"
        ins = ", ".join(f"`{i}`" for i in self.inputs)
        return f"look between {ins} (match) and `{self.name}`"

    def as_json(self) -> dict:
        metrics = {}
        tol = {}
        for t in self.tensors:
            metrics[t.name] = t.metrics_json()
            tol[t.name] = t.tolerance
        return json_safe({"name": self.name, "status": self.status, "root": self.root, "inputs": self.inputs,
                        "reason": self.reason, "meaning": self.meaning, "metrics": metrics, "tolerance": tol,
                        "tensors": [t.as_json() for t in self.tensors], "diagnosis": self.diagnosis})


@dataclass
class Report:
    a: str
    b: str
    model: str
    boundaries: list[BoundaryResult]
    notes: list[str] = field(default_factory=list)
    producers: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    tolerances: str = "defaults"
    where: str = ""  # where the dumps A and B name are kept and until when (set by the pipeline)
    # how the float tensors were judged (`walk.judgement`): {"kind": "direct" | "two-way" |
    # "three-way", ...}; two-way (a low-precision side, no floor run) says what it cannot see
    judgement: dict = field(default_factory=lambda: {"kind": "direct"})

    @property
    def verdict(self) -> str:
        return "match" if all(b.status in PASSING for b in self.boundaries) else "diverged"

    @property
    def earliest(self) -> list[str]:
        return [b.name for b in self.boundaries if b.root]

    @property
    def generated(self) -> dict | None:
        """What the generated tokens did (the `token.step.K` boundaries, each the token fed to
        decode step K): None without decode steps, else {"steps": K compared, "differ": [K whose
        token differs], "first": the first of them or None, "status": that boundary's status
        (benign: a near-tie flip), "benign": whether it is a benign near-tie flip}."""
        steps, differ, status = [], [], {}
        for b in self.boundaries:
            m = TOKEN_STEP.match(b.name)
            if not m:
                continue
            k = int(m.group(1))
            steps.append(k)
            status[k] = b.status
            ids = [t for t in b.tensors if t.name.endswith(".ids")]
            if any(getattr(t.metrics, "rows_differ", 0) for t in ids) or b.status in ("benign", "cascade"):
                differ.append(k)
        if not steps:
            return None
        first = min(differ) if differ else None
        return {"steps": sorted(steps), "differ": sorted(differ), "first": first,
                "status": status[first] if first is not None else None,
                "benign": status[first] == "benign" if first is not None else None}

    def boundary(self, name: str) -> BoundaryResult:
        for b in self.boundaries:
            if b.name == name:
                return b
        raise KeyError(name)

    def __bool__(self) -> bool:
        return self.verdict == "match"

    def __str__(self) -> str:
        """A short summary: the verdict, then one line per boundary (`reports.text` renders the table)."""
        head = f"{self.verdict.upper()}: {self.a} vs {self.b}"
        if self.earliest:
            head += f"; earliest divergence at {', '.join(self.earliest)}"
        lines = [head]
        for b in self.boundaries:
            lines.append(f"  {b.name}: {b.status}" + (" (root)" if b.root else "") + (f": {b.reason}" if b.reason else ""))
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def as_json(self) -> dict:
        return json_safe({"verdict": self.verdict, "earliest": self.earliest,
                        "look": [self.boundary(n).look_between for n in self.earliest],
                        "diagnosis": {b.name: b.diagnosis for b in self.boundaries if b.diagnosis is not None},
                        "a": self.a, "b": self.b, "where": self.where, "model": self.model, "notes": self.notes,
                        "tolerances": self.tolerances, "producers": self.producers, "runs": self.runs,
                        "judgement": self.judgement, "generated": self.generated,
                        "boundaries": [b.as_json() for b in self.boundaries]})


def json_safe(x):
    """JSON has no inf/nan: spell them as strings so any parser reads the report."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
