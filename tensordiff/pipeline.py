"""The pipeline of one case: the oracle (cached), the engine, the comparison, local error and
the report views. `tensordiff check` is one case; `tensordiff gate` is a config, a loop over
cases and a progress display (`gate.run_gate`); `tensordiff calibrate` takes its oracle dumps
from `oracle_dump` here. Nothing else assembles these steps.

    spec = CaseSpec("deepseek-v4.1-flash", fault="aligner-flat-pad")
    case = check(spec)                  # a CaseResult: report, local error, timings, dumps
    case.report.verdict                 # "match" | "diverged"

Where dumps go: under `out` when given (refused when it exists and is not empty); otherwise in a
temporary directory removed when the case ends, and the report says so in its notes. A cached
oracle dump is used in place (it outlives the command) unless `out` asks for a copy.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from . import oracle_cache
from .adapter import ModelAdapter, RunRequest
from .errors import BadInput
from .outputs import dump_root

# The passes a case can run (`CaseSpec.passes`; the gate picks them with `gate.case_passes`):
#   semantic  engine float32 against oracle float32: approximations (a tanh GELU) that bf16 hides;
#             beside numeric, in the model's exact numerics (`exact_request`), else the run's options
#   numeric   three-way in the run's precision: the engine's error as multiples of the oracle's own
#             in that precision (tensordiff.floor), row-aware, against a calibrated profile if any
#   direct    the engine at its dtype against the oracle at oracle_dtype (one comparison; `check`)
PASSES = ("semantic", "numeric", "direct")
# The steps of a case, in order, each timed (`CaseResult.timings`).
STAGES = ("weights", "oracle", "engine", "compare", "local_error", "report")
TEMPORARY_NOTE = ("the dumps this report names were temporary and are gone{cached}; "
                  "pass --out DIR to keep them")


@dataclass(frozen=True)
class CaseSpec:
    """Everything one case runs on; `request()` validates it into the engine's RunRequest."""

    model: str
    image: Path | None = None
    weights: str = "synthetic:tiny"
    device: str = "cpu"
    dtype: str = "float32"
    oracle_dtype: str | None = None  # None: the engine's dtype
    backend: str = "torch"
    fault: str | None = None
    prompt: str | None = None
    chunk: int | None = None
    decode: int = 0
    processor: str | None = None
    extra: tuple[str, ...] = ()  # KEY=VALUE model options
    passes: tuple[str, ...] | None = None  # PASSES to run; None: ("direct",)
    layers: str | None = None  # DeepSeek language backbone: run only these layers ("0-2")
    more_images: tuple[Path, ...] = ()  # the prompt's further images after `image`, in order

    def request(self, adapter: ModelAdapter | None = None) -> tuple[ModelAdapter, RunRequest]:
        from .runs import make_request

        return make_request(self.model, image=self.image, weights=self.weights, device=self.device, dtype=self.dtype,
                            backend=self.backend, fault=self.fault, prompt=self.prompt, chunk=self.chunk,
                            decode=self.decode, processor=self.processor, extra=self.extra, adapter=adapter,
                            fault_dtype=self.carrier_dtype, layers=self.layers, more_images=self.more_images)

    @property
    def carrier_dtype(self) -> str:
        return carrier_dtype(self.passes, self.dtype)


def carrier_dtype(passes, dtype: str) -> str:
    """The precision in which a case can carry a planted fault: a semantic pass runs the engine in
    float32 whatever the case's dtype, so a fault below bf16 resolution is reached."""
    return "float32" if passes and "semantic" in passes else dtype


def default_passes(dtype: str, oracle_dtype: str | None = None) -> tuple[str, ...]:
    """The passes a case runs when none are asked for (`check --passes auto`, a gate case without
    `passes`): semantic + numeric for a low-precision run, semantic alone in float32 (where it is
    the direct comparison), direct when an oracle dtype other than the engine's is pinned (the
    one-pass comparison that asks for)."""
    if oracle_dtype not in (None, dtype):
        return ("direct",)
    return ("semantic",) if dtype == "float32" else ("semantic", "numeric")


def parse_passes(text: str | None, dtype: str, oracle_dtype: str | None = None) -> tuple[str, ...]:
    """`--passes`: auto (None) or a comma-separated list of PASSES, validated."""
    if text is None or text.strip() == "auto":
        return default_passes(dtype, oracle_dtype)
    out = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in out if p not in PASSES]
    if bad or not out:
        raise BadInput(f"--passes {text!r}: expected auto or a comma-separated list of {', '.join(PASSES)}")
    if len(set(out)) != len(out) or ("semantic" in out and "direct" in out):
        raise BadInput(f"--passes {text!r}: each pass once, and semantic or direct, not both")
    if "numeric" in out and dtype == "float32":
        raise BadInput("--passes numeric judges a low-precision run against float32: give --dtype bfloat16")
    if oracle_dtype is not None and "direct" not in out:
        raise BadInput(f"--oracle-dtype sets the direct pass's oracle; --passes {text!r} has no direct pass")
    return out


def exact_request(adapter: ModelAdapter, req: RunRequest) -> RunRequest:
    """`req` in float32 with the adapter's exact numerics (`ModelAdapter.exact_options`): both
    sides of the semantic pass, and the oracle of the numeric pass's reference."""
    return replace(req, dtype="float32", options={**req.options, **dict(adapter.exact_options)})


def oracle_request(req: RunRequest, oracle_dtype: str | None = None) -> RunRequest:
    """The oracle's request for an engine request: no fault, reference kernels, one prefill
    chunk, and its own dtype when one is asked for."""
    return replace(req, fault=None, backend="torch", chunk=None, dtype=oracle_dtype or req.dtype)


@dataclass(frozen=True)
class OracleDump:
    path: Path
    cached: bool  # read from the cache (this run did not compute it)
    cache: str  # oracle_cache.Lookup.status: "hit" | "miss" | "rejected" | "off", or "unused"
    note: str = ""  # why a cached dump was rejected, or why there is no cache


def oracle_dump(adapter: ModelAdapter, oreq: RunRequest, scratch: Path, use_cache: bool,
                wrap: Callable[[], Any] | None = None) -> OracleDump:
    """The oracle's dump for `oreq`: from the cache when a verified entry has its key, else run
    (into the cache, or into `scratch` without one). `wrap()` is a context manager around the
    run (calibrate's attention-kernel variants). A cached dump is read in place, never modified."""

    from .runs import run_side

    def produce(target: Path) -> Path:
        with (wrap() if wrap is not None else _nothing()):
            return run_side(adapter, "oracle", oreq, target)

    if not use_cache:
        return OracleDump(produce(scratch), False, "unused")
    k = oracle_cache.key(adapter, oreq)
    found = oracle_cache.lookup(k)
    if found.path is not None:
        return OracleDump(found.path, True, found.status)
    if k is None:
        return OracleDump(produce(scratch), False, found.status, found.note)
    return OracleDump(oracle_cache.store(k, produce), False, found.status, found.note)


@contextmanager
def _nothing():
    yield


def prepare_out(out: str | Path | None) -> Path | None:
    """The one check on an output directory (`outputs.dump_root`): created if missing, refused
    when it is a file, not empty, or not writable."""
    return None if out is None else dump_root(out)


def check_weights(spec: str, base: Path, where: str) -> str:
    """The one check on a weights SPEC from a file or an option: `synthetic:<variant>` as given,
    else a checkpoint directory (relative to `base`), returned absolute."""
    if spec.startswith("synthetic:"):
        return spec
    try:
        p = Path(spec).expanduser()
    except RuntimeError:  # ~name of no user on this machine
        raise BadInput(f"{where}: weights {spec!r}: {spec.split('/')[0]} is no user's home directory on this "
                       "machine") from None
    p = p if p.is_absolute() else base / p
    if not p.is_dir():
        raise BadInput(f"{where}: weights {spec!r} is neither synthetic:<variant> nor a checkpoint directory ({p})")
    return str(p.resolve())


@contextmanager
def workspace(out: Path | None, prefix: str) -> Iterator[tuple[Path, bool]]:
    """(directory for the dumps, kept?): `out` itself, or a temporary directory removed on exit."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        yield out, True
        return
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp, False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- one case

@dataclass
class CaseResult:
    model: str
    image: Path
    prompt: str | None
    dtype: str
    label: str
    report: Any = None  # Report
    local: Any = None  # LocalReport | None
    timings: dict[str, float] = field(default_factory=dict)
    runner_timings: dict[str, dict] = field(default_factory=dict)  # what runners put in run.timings
    error: str | None = None
    oracle_cached: bool = False
    oracle_cache: str = "unused"  # hit | miss | rejected | off | unused
    views: list = field(default_factory=list)
    dumps: dict[str, str] = field(default_factory=dict)
    kept: bool = True  # the dumps named in `dumps` exist after the command
    geometry: list[str] = field(default_factory=list)  # discrete preprocessing rules this image exercises
    passes: tuple[str, ...] = ()  # what ran: `report` is the first (semantic/direct), `numeric` the three-way
    numeric: Any = None  # Report of the numeric pass, when it ran beside another pass
    # local error of the numeric pass beside another (the run's engine stages on the floor run's
    # tensors), when a near-tie flip's cascade there leaves what the flip feeds to local error
    local_numeric: Any = None

    @property
    def passed(self) -> bool:
        return (self.report is not None and self.report.verdict == "match"
                and (self.numeric is None or self.numeric.verdict == "match")
                and (self.local is None or self.local.origin is None)
                and (self.local_numeric is None or self.local_numeric.origin is None))

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def summary_line(self) -> str:
        t = self.timings
        total = sum(t.values())
        parts = ", ".join(f"{k} {v:.2f}" for k, v in t.items())
        cache = {"hit": "; oracle cached", "rejected": "; cached oracle failed verification, recomputed"}
        timing = f"({total:.2f} s: {parts}{cache.get(self.oracle_cache, '')})"
        if self.report is None:
            return f"ERROR {self.label}: {self.error} {timing}"
        from .report import diagnosis_brief, headline

        r = self.report
        local = ""
        if self.local is not None:
            local = (f"; local origin `{self.local.origin}`" if self.local.origin
                     else "; local: every stage within tolerance" if self.local.available else "; local: n/a")
        if self.local_numeric is not None and self.local_numeric.origin:
            local += f"; numeric local origin `{self.local_numeric.origin}`"
        if self.numeric is not None:
            sem = (f"{len(r.boundaries)} boundaries within tolerance" if r.verdict == "match" else headline(r))
            num = ("every boundary within its floor multiples" if self.numeric.verdict == "match"
                   else headline(self.numeric))
            return (f"{'PASS ' if self.passed else 'FAIL '} {self.label}: {self.passes[0]}: {sem}; numeric: {num}"
                    f"{local} {timing}")
        if self.passed:
            return f"PASS  {self.label}: {len(r.boundaries)} boundaries within tolerance{local} {timing}"
        return f"FAIL  {self.label}: {headline(r)}{diagnosis_brief(r)}{local} {timing}"

    def as_json(self) -> dict:
        return {"model": self.model, "image": str(self.image), "prompt": self.prompt, "dtype": self.dtype,
                "label": self.label, "passed": self.passed, "error": self.error,
                "timings": {k: round(v, 4) for k, v in self.timings.items()},
                "runner_timings": self.runner_timings, "oracle_cached": self.oracle_cached,
                "oracle_cache": self.oracle_cache, "dumps": self.dumps, "dumps_kept": self.kept,
                "geometry": self.geometry,
                "passes": list(self.passes),
                "report": self.report.as_json() if self.report is not None else None,
                "numeric": self.numeric.as_json() if self.numeric is not None else None,
                "local_error": self.local.as_json() if self.local is not None else None,
                "local_error_numeric": self.local_numeric.as_json() if self.local_numeric is not None else None}


@contextmanager
def timed(timings: dict, key: str, prog=None, label: str = ""):
    """Add the block's wall time to `timings[key]`; tell `prog` (a gate progress) what runs."""
    if prog:
        prog.step(label, key.replace("_", " "))
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        if prog:
            prog.done_step()


def status(msg: str) -> None:
    """A one-line status on a terminal's stderr (`check`); nothing when piped."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{msg}")
        sys.stderr.flush()


def run_case(spec: CaseSpec, work: Path, *, kept: bool, tolerances=None, use_cache: bool = True,
             local: bool = False, views: bool = False, label: str | None = None, prog=None,
             adapter: ModelAdapter | None = None, floor=None) -> CaseResult:
    """Oracle (cached), engine, comparison, local error, report views, for one case. `work` holds
    this case's dumps (`oracle/`, `engine/`, `local/`); `kept` says whether it outlives the
    command. `tolerances` are the user's (a `Tolerances`, a file or None). `spec.passes` says
    what runs (`PASSES`): the first of semantic / direct gives `report`; numeric gives `numeric`
    (or `report` when it runs alone), judged by `floor` = (FloorRule, profile) or the defaults."""
    from .compare import compare_dumps
    from .dump import open_dump
    from .judge import Judge
    from .local_error import local_error, unavailable
    from .runs import run_side
    from .tolerance import Tolerances
    from .tolerance import load as load_tolerances

    label = label or spec.model
    say = status if prog is None else (lambda msg: None)  # a gate shows its own progress
    case = CaseResult(spec.model, Path(spec.image) if spec.image else Path(), spec.prompt, spec.dtype, label,
                      kept=kept)
    with timed(case.timings, "weights", prog, label):
        adapter, req = spec.request(adapter)
        case.image = Path(req.image)
        tols = tolerances if isinstance(tolerances, Tolerances) else load_tolerances(tolerances)
    passes = case.passes = tuple(spec.passes or ("direct",))
    first = next((p for p in passes if p != "numeric"), None)
    ereq = req  # the run in its own precision (the numeric pass)
    if first == "semantic" and "numeric" in passes:
        # both sides in float32 with the model's exact numerics: the run's own numerics (DeepSeek's
        # official bf16 language half) are the numeric pass's to judge
        req, oracle_dtype = exact_request(adapter, req), "float32"
    elif first == "semantic":  # a float32 case: the semantic pass is the run itself
        req, oracle_dtype = replace(req, dtype="float32"), "float32"
    elif first == "direct":
        oracle_dtype = spec.oracle_dtype
    else:  # numeric alone: its floor run is the oracle the rest (local error) compares with
        oracle_dtype = None
    oreq = oracle_request(req, oracle_dtype)
    with timed(case.timings, "oracle", prog, label):
        say(f"running the oracle ({spec.model}, {oreq.dtype}, {oreq.device})…")
        od = oracle_dump(adapter, oreq, work / "oracle", use_cache)
        case.oracle_cached, case.oracle_cache = od.cached, od.cache
        odir = od.path
        if kept and odir != work / "oracle":  # --out keeps both dumps side by side
            shutil.copytree(odir, work / "oracle")
            odir = work / "oracle"
    with timed(case.timings, "engine", prog, label):
        say(f"running the engine ({req.backend}, {req.dtype}{', fault ' + req.fault if req.fault else ''})…")
        edir = run_side(adapter, "engine", req, work / "engine")
    case.dumps = {"oracle": str(odir), "engine": str(edir)}
    if adapter.geometry:
        from .geometry import exercised

        case.geometry = exercised(adapter.geometry, open_dump(odir))
    judge = Judge.build(adapter.contract, tols, run_dtypes=(oreq.dtype, req.dtype))
    with timed(case.timings, "compare", prog, label):
        say("comparing…")
        if first:
            case.report = compare_dumps(odir, edir, judge)
            # a root no direct hypothesis explains: replay the engine's stage on re-laid inputs
            from .diagnosis.replay import replay_roots

            replay_roots(adapter, req, odir, edir, case.report)
        if "numeric" in passes:
            # the semantic pass's oracle is the numeric pass's reference (float32, exact numerics)
            num = _numeric(adapter, ereq, odir if first == "semantic" else None,
                           odir if not first else None, edir if not first else None, work, kept, use_cache, tols,
                           floor, case)
            if first:
                case.numeric = num
            else:
                case.report = num
    if od.cache == "rejected":
        case.report.notes.append(od.note)
    if not kept:
        where = "" if odir.is_relative_to(work) else f" except the oracle's, kept in the cache at {odir}"
        case.report.notes.append(TEMPORARY_NOTE.format(cached=where))
    # a near-tie flip's cascade passes end to end only because local error judges what it feeds:
    # so a case with a cascade runs local error even when it was not asked for (a layer subset
    # too: its stages chain through the subset's own layers)
    cascade = any(b.status == "cascade" for r in (case.report, case.numeric) if r is not None for b in r.boundaries)
    if (local or (cascade and adapter.stages is not None)):
        if cascade and not local:
            say("a near-tie flip's cascade: judging the stages after it by local error…")
        with timed(case.timings, "local_error", prog, label):
            case.local = (local_error(adapter, req, odir, case.report, judge, work, engine_dir=edir)
                          if adapter.stages is not None else unavailable(adapter.name))
    elif prog:
        prog.done_step()
    if (case.numeric is not None and adapter.stages is not None
            and any(b.status == "cascade" for b in case.numeric.boundaries)):
        # the semantic pass's local error judges its own (float32) stages; what a flip of the
        # numeric pass feeds is judged here, the run's engine stages on the floor run's tensors
        with timed(case.timings, "local_error"):
            floor_dir = Path(case.dumps["floor"])
            njudge = Judge.build(adapter.contract, tols, run_dtypes=(ereq.dtype, ereq.dtype))
            case.local_numeric = local_error(adapter, ereq, floor_dir, case.numeric, njudge, work / "numeric")
            # its decode steps: the whole network for one token, judged three-way (floor-relative)
            from .floor import DEFAULT_RULE
            from .local_error import decode_three_way

            decode_three_way(adapter, ereq, Path(case.dumps["reference"]), floor_dir, case.local_numeric,
                             work / "numeric", (floor or (DEFAULT_RULE, {}))[0])
    if views:
        from .report_html import heat_views

        with timed(case.timings, "report", prog, label):
            case.views = heat_views(case.report, open_dump(odir))
            if case.numeric is not None:
                case.views += heat_views(case.numeric, open_dump(odir))
    for side, d in (("oracle", odir), ("engine", edir)):
        if side == "oracle" and case.oracle_cached:
            continue  # a cached dump's timings are another run's
        rt = open_dump(d).run.get("timings")
        if isinstance(rt, dict):
            case.runner_timings[side] = rt
    say("")
    return case


def _numeric(adapter, req: RunRequest, ref: Path | None, floor_dir: Path | None, eng: Path | None, work: Path,
             kept: bool, use_cache: bool, tols, floor, case: CaseResult):
    """The numeric pass of one case: the oracle in float32 with the exact numerics (`ref`, when the
    semantic pass has it: `exact_request`) and in the run's dtype with the run's options
    (`floor_dir`, the floor run: for DeepSeek's language half under `official` numerics, the
    official bf16 + kernel rounding the engine runs too), the engine in the run's dtype (`eng`,
    when run), judged three-way (`floor.three_way`) by `floor` = (FloorRule, profile), else the
    defaults."""
    from .floor import DEFAULT_RULE, three_way
    from .runs import run_side

    rule, profile = floor or (DEFAULT_RULE, {})
    base = oracle_request(req)
    if ref is None:
        ref = oracle_dump(adapter, exact_request(adapter, base), work / "oracle-float32", use_cache).path
    if floor_dir is None:
        floor_dir = oracle_dump(adapter, base, work / "oracle-floor", use_cache).path
    if eng is None:
        eng = run_side(adapter, "engine", req, work / f"engine-{req.dtype}")
    case.dumps.update({"reference": str(ref), "floor": str(floor_dir), "numeric_engine": str(eng)})
    return three_way(ref, floor_dir, eng, rule, profile=profile, tolerances=tols)


def check(spec: CaseSpec, *, out: str | Path | None = None, tolerances=None, use_cache: bool = True,
          views: bool = False, local: bool = False) -> CaseResult:
    """`tensordiff check`: one case."""
    out = prepare_out(out)
    with workspace(out, "tensordiff-check-") as (work, kept):
        return run_case(spec, work, kept=kept, tolerances=tolerances, use_cache=use_cache, views=views, local=local)


# ----------------------------------------------------------------------------- report files

def lone_case(report, dump_a=None, views=None):
    """A report outside a gate (`compare`, `check`) as the one case of a JUnit / HTML file; its
    heatmaps from `views`, or drawn over `dump_a` (the reference dump, opened) when given."""
    from .report_html import heat_views
    from .report_junit import case_of

    case = case_of(report)
    case.views = views if views is not None else (heat_views(report, dump_a) if dump_a is not None else [])
    return case


def write_reports(*, report_json: dict | None = None, json_path=None, cases=(), junit_path=None, html_path=None,
                  title: str = "tensordiff", name: str | None = None) -> None:
    """The report files of a command: the JSON (`report_json`, as the command shapes it), JUnit
    and HTML over `cases`."""
    if json_path and report_json is not None:
        import json

        from .result import _finite
        from .storage import write_text_atomic

        write_text_atomic(json_path, json.dumps(_finite(report_json), indent=1) + "\n", "the JSON report")
    if junit_path:
        from .report_junit import write_junit

        write_junit(list(cases), junit_path, **({"name": name} if name else {}))
    if html_path:
        from .report_html import write_html

        write_html(list(cases), html_path, title=title)
