"""The pipeline of one case: the oracle (cached), the engine, the comparison, local error and
the report views. `tensordiff check` is one case; `tensordiff gate` is a config, a loop over
cases and a progress display (`gate.run_gate`); `tensordiff calibrate` takes its oracle dumps
from `oracle_dump` here. Nothing else assembles these steps.

    spec = CaseSpec("deepseek-v4.1-flash", fault="aligner-flat-pad")
    case = check(spec)                  # a CaseResult: report, local error, timings, dumps
    case.report.verdict                 # "match" | "diverged"

Where dumps go: under `out` when given (refused when it exists and is not empty); otherwise in the
last-run directory of the command, `<cache>/last/check/<model>/` (`check`) or
`<cache>/last/gate/<gate name>/` (`gate`): written under a staging name beside it and swapped into
place when the command ends, replacing the previous run's (only a directory that carries
`LAST_MARK`, which only this module writes, is ever replaced or removed). Every path a report
names exists after the command, and the report says where its dumps are and until when
(`Report.where`). A cached oracle dump is used in place (it outlives the command) unless `out`
asks for a copy.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from tensordiff.pipeline import oracle_cache, registry
from tensordiff.pipeline.adapter import ModelAdapter, RunRequest
from tensordiff.errors import BadInput
from tensordiff.reports.outputs import dump_root
from tensordiff.format.dump import open_dump
from tensordiff.format.storage import write_text_atomic
from tensordiff.judge.diagnosis.replay import replay_roots
from tensordiff.judge.floor import DEFAULT_RULE
from tensordiff.judge.geometry import exercised
from tensordiff.judge.judge import Judge
from tensordiff.judge.result import json_safe
from tensordiff.judge.tolerance import load as load_tolerances, Tolerances
from tensordiff.pipeline.compare import compare_dumps, three_way
from tensordiff.pipeline.local_error import local_error, unavailable
from tensordiff.pipeline.runs import make_request, run_dtype, run_side
from tensordiff.reports.html import heat_views, write_html
from tensordiff.reports.junit import case_of, write_junit
from tensordiff.reports.text import diagnosis_brief, headline, tokens_changed
from tensordiff.cache import cache_root

# The passes a case can run (`CaseSpec.passes`; the gate picks them with `gate.case_passes`):
#   semantic  engine float32 against oracle float32: approximations (a tanh GELU) that bf16 hides;
#             for a low-precision run in the model's exact numerics (`exact_request`), for a
#             float32 run the run itself
#   numeric   three-way in the run's precision: the engine's error as multiples of the oracle's own
#             in that precision (tensordiff.judge.floor), row-aware, against a calibrated profile if any
#   direct    the float32 engine against the float32 oracle, the run's own options (one comparison;
#             a low-precision run has no direct pass: no tensor computed in bf16 is judged by a
#             flat tolerance, only against its floor)
# A case with no passes named runs `default_passes`: a low-precision run (every model's default:
# its official dtype) semantic + numeric, a float32 run semantic alone.
PASSES = ("semantic", "numeric", "direct")
LOW_PRECISION = ("bfloat16", "float16")
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
    dtype: str | None = None  # None: the model's official dtype (`runs.run_dtype`)
    oracle_dtype: str | None = None  # the direct pass's oracle: None or float32 (the reference of every pass)
    backend: str = "torch"
    fault: str | None = None
    prompt: str | None = None
    chunk: int | None = None
    decode: int = 0
    processor: str | None = None
    extra: tuple[str, ...] = ()  # KEY=VALUE model options
    passes: tuple[str, ...] | None = None  # PASSES to run; None: `default_passes` of the dtype
    layers: str | None = None  # DeepSeek language backbone: run only these layers ("0-2")
    more_images: tuple[Path, ...] = ()  # the prompt's further images after `image`, in order

    def resolved(self, adapter: ModelAdapter | None = None) -> tuple[ModelAdapter, "CaseSpec"]:
        """This case with its dtype (the model's official one when none is given) and its passes
        (`default_passes` when none are given) filled in and checked (`check_passes`)."""
        adapter = adapter or registry.adapter(self.model)
        dtype = run_dtype(adapter, self.weights, self.dtype)
        passes = tuple(self.passes) if self.passes else default_passes(dtype, self.oracle_dtype)
        check_passes(passes, dtype, self.oracle_dtype)
        return adapter, replace(self, dtype=dtype, passes=passes)

    def request(self, adapter: ModelAdapter | None = None) -> tuple[ModelAdapter, RunRequest]:
        adapter, spec = self.resolved(adapter)
        return make_request(spec.model, image=spec.image, weights=spec.weights, device=spec.device, dtype=spec.dtype,
                            backend=spec.backend, fault=spec.fault, prompt=spec.prompt, chunk=spec.chunk,
                            decode=spec.decode, processor=spec.processor, extra=spec.extra, adapter=adapter,
                            fault_dtype=spec.carrier_dtype, layers=spec.layers, more_images=spec.more_images)

    @property
    def carrier_dtype(self) -> str:
        return carrier_dtype(self.passes, self.dtype or "float32")


def carrier_dtype(passes, dtype: str) -> str:
    """The precision in which a case can carry a planted fault: a semantic pass runs the engine in
    float32 whatever the case's dtype, so a fault below bf16 resolution is reached."""
    return "float32" if passes and "semantic" in passes else dtype


def default_passes(dtype: str, oracle_dtype: str | None = None) -> tuple[str, ...]:
    """The passes a case runs when none are asked for (`check` with no --passes, a gate case
    without `passes`): semantic + numeric for a low-precision run (a model's official dtype:
    the float32 oracle is both passes' reference), semantic alone in float32."""
    return ("semantic",) if dtype == "float32" else ("semantic", "numeric")


def check_passes(passes: tuple[str, ...], dtype: str, oracle_dtype: str | None = None, where: str = "--passes") -> None:
    """A case's passes against its dtypes: no flat tolerance ever judges a low-precision tensor."""
    if "numeric" in passes and dtype == "float32":
        raise BadInput(f"{where} numeric judges a low-precision run against float32: give --dtype bfloat16 "
                       "(or leave --dtype out: the model's official dtype)")
    if "direct" in passes and dtype != "float32":
        raise BadInput(f"{where} direct judges by one flat tolerance, which a {dtype} tensor is never judged by: "
                       f"a {dtype} run is judged against its floor (numeric; leave {where} out for semantic,numeric)")
    if oracle_dtype not in (None, "float32"):
        raise BadInput(f"oracle dtype {oracle_dtype}: the reference of every pass is the float32 oracle; the "
                       f"oracle in {oracle_dtype} is the numeric pass's floor run (leave the oracle dtype out)")


def parse_passes(text: str | None, dtype: str, oracle_dtype: str | None = None) -> tuple[str, ...]:
    """`--passes`: auto (None) or a comma-separated list of PASSES, validated."""
    if text is None or text.strip() == "auto":
        out = default_passes(dtype, oracle_dtype)
    else:
        out = tuple(p.strip() for p in text.split(",") if p.strip())
        bad = [p for p in out if p not in PASSES]
        if bad or not out:
            raise BadInput(f"--passes {text!r}: expected auto or a comma-separated list of {', '.join(PASSES)}")
        if len(set(out)) != len(out) or ("semantic" in out and "direct" in out):
            raise BadInput(f"--passes {text!r}: each pass once, and semantic or direct, not both")
    check_passes(out, dtype, oracle_dtype)
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


LAST = "last"  # <cache>/last/<command>/<name>/: the last run's dumps of each model (check) or gate
LAST_MARK = ".tensordiff-last-run"  # in every last-run directory: the mark that it is ours to replace


def last_dir(command: str, name: str) -> Path:
    """Where the last run of `command` ("check", "gate") on `name` (a model, a gate) keeps its
    dumps: `<cache>/last/<command>/<name>/` (the name with anything but letters, digits, `.`, `_`
    and `-` as `_`)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "_"
    return cache_root() / LAST / command / safe


def _ours(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and (p / LAST_MARK).is_file()


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux `renameat2(RENAME_EXCHANGE)`): no moment where
    either name is missing. False where the system or the file system has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@dataclass
class Workspace:
    """Where a command's dumps are written (`path`) and where they are after it (`final`).

    Under `--out` both are the user's directory. Otherwise `path` is a staging directory beside the
    last-run directory `final`, swapped into its place by `close()` (the previous run's, which
    carries `LAST_MARK`, is removed); the cases handed to `hold()` then name `final`, and each
    report's `where` says where its dumps are and until when."""

    path: Path
    final: Path
    out: bool  # the user's --out: kept for good, the cached oracle copied beside the engine
    command: str = "check"
    name: str = ""
    cases: list = field(default_factory=list)
    replaced: bool = True  # close() put `path` in `final`'s place (False: `final` was not ours)

    def hold(self, case: "CaseResult") -> "CaseResult":
        """A case whose dumps are in this workspace: its paths follow the directory on close."""
        self.cases.append(case)
        return case

    def close(self) -> None:
        if not self.out:
            self.replaced = _commit(self.path, self.final)
            if self.replaced:
                for c in self.cases:
                    relocate(c, self.path, self.final)
        for c in self.cases:
            for r in (c.report, c.numeric):
                if r is not None:
                    r.where = self.where(c)

    def discard(self) -> None:
        """The command failed: its staging directory goes; the previous run's stays as it was."""
        if not self.out:
            shutil.rmtree(self.path, ignore_errors=True)

    def where(self, case: "CaseResult") -> str:
        """The line under A and B: where the dumps are and until when."""
        cached = ""
        oracle = case.dumps.get("oracle")
        if oracle and not any(Path(oracle).is_relative_to(d) for d in (self.final, self.path)):
            cached = "; the oracle's dump is the cache entry A names"
        if self.out:
            return f"kept in {self.final} (--out){cached}"
        if not self.replaced:
            return (f"in {self.path}: {self.final} is not a tensordiff last-run directory (no {LAST_MARK}), "
                    f"so it was left as it is{cached}")
        return (f"this run's, in {self.final}, until the next {self.command} of {self.name} replaces them "
                f"(--out DIR keeps a run's dumps for good){cached}")


def _commit(staging: Path, final: Path) -> bool:
    """Put `staging` in `final`'s place; the previous run's directory there is removed only when it
    carries LAST_MARK. False (staging left where it is) when `final` is something else. Another
    process's commit of the same name may run at the same time: the last one stays."""
    for _ in range(8):
        try:
            return _swap(staging, final)
        except FileNotFoundError:  # `final` went away between two steps (another commit): again
            continue
    return _swap(staging, final)


def _swap(staging: Path, final: Path) -> bool:
    try:
        os.rename(staging, final)  # nothing there yet
        return True
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise
    if not _ours(final):
        return False
    if _exchange(staging, final):
        if not _ours(staging):  # what came back is not ours after all (replaced meanwhile): undo
            _exchange(staging, final)
            return False
        shutil.rmtree(staging, ignore_errors=True)
        return True
    aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.replaced-", dir=final.parent))
    try:
        os.rename(final, aside / "run")
        os.rename(staging, final)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return True


def relocate(case: "CaseResult", old: Path, new: Path) -> None:
    """The paths a case names under `old` named under `new` (the workspace moved)."""
    o, n = str(old), str(new)

    def moved(s: str) -> str:
        return n + s[len(o):] if s == o or s.startswith(o + os.sep) else s

    case.dumps = {k: moved(v) for k, v in case.dumps.items()}
    for r in (case.report, case.numeric):
        if r is not None:
            r.a, r.b = moved(r.a), moved(r.b)
            r.notes = [note.replace(o, n) for note in r.notes]


@contextmanager
def workspace(out: Path | None, command: str, name: str) -> Iterator[Workspace]:
    """The directory of a command's dumps: `out` itself, or a staging directory that becomes
    `last_dir(command, name)` when the command ends (removed if it fails). Refused before anything
    runs when that directory exists and is not ours."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        ws = Workspace(out, out, True, command, name)
        yield ws
        ws.close()
        return
    final = last_dir(command, name)
    if (final.exists() or final.is_symlink()) and not _ours(final):
        raise BadInput(f"{final} exists and is not a tensordiff last-run directory (no {LAST_MARK}): "
                       "move it away, or pass --out DIR")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes it private; the cache's directories are readable
    (staging / LAST_MARK).write_text(f"tensordiff {command} {name}: the last run's dumps, replaced by the next "
                                     "run; safe to delete\n")
    ws = Workspace(staging, final, False, command, name)
    try:
        yield ws
    except BaseException:
        ws.discard()
        raise
    ws.close()


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
    # local error of the numeric pass beside another (the run's engine stages in its precision on
    # the float32 reference's tensors, judged three-way), when it ran (`run_case`'s `local`)
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

        r = self.report
        local = ""
        if self.local is not None:
            local = (f"; local origin `{self.local.origin}`" if self.local.origin
                     else "; local: every stage within tolerance" if self.local.available else "; local: n/a")
        if self.local_numeric is not None and self.local_numeric.origin:
            local += f"; numeric local origin `{self.local_numeric.origin}`"
        if self.numeric is not None:
            sem = (f"{len(r.boundaries)} boundaries within tolerance" if r.verdict == "match"
                   else headline(r) + diagnosis_brief(r))
            num = ("every boundary within its floor multiples" if self.numeric.verdict == "match"
                   else headline(self.numeric))
            sem += f" ({tokens_changed(r)})" if r.verdict == "match" and tokens_changed(r) else ""
            num += (f" ({tokens_changed(self.numeric)})" if self.numeric.verdict == "match"
                    and tokens_changed(self.numeric) else "")
            return (f"{'PASS ' if self.passed else 'FAIL '} {self.label}: {self.passes[0]}: {sem}; numeric: {num}"
                    f"{local} {timing}")
        if self.passed:
            flip = f" ({tokens_changed(r)})" if tokens_changed(r) else ""
            return f"PASS  {self.label}: {len(r.boundaries)} boundaries within tolerance{flip}{local} {timing}"
        return f"FAIL  {self.label}: {headline(r)}{diagnosis_brief(r)}{local} {timing}"

    def as_json(self) -> dict:
        """The one JSON schema of a case, written alike by `check --json` and, per case, by the gate:
        the top-level report's fields (`Report.as_json`: verdict, earliest, look, diagnosis, a, b,
        model, notes, tolerances, producers, runs, boundaries) with the pass it is (`pass`), then
        the case's own: `passes`, `passed`, `numeric` (the numeric pass's report beside the
        semantic one), `local_error`, `local_error_numeric`, `error`, the inputs (`image`,
        `prompt`, `dtype`, `label`), `timings`, `runner_timings`, `oracle_cached`, `oracle_cache`,
        `dumps`, `dumps_kept` and `geometry`."""
        out = self.report.as_json() if self.report is not None else {"verdict": "error", "model": self.model}
        out.update({"pass": self.passes[0] if self.passes else None, "passes": list(self.passes),
                    "passed": self.passed, "error": self.error,
                    "numeric": self.numeric.as_json() if self.numeric is not None else None,
                    "local_error": self.local.as_json() if self.local is not None else None,
                    "local_error_numeric": self.local_numeric.as_json() if self.local_numeric is not None else None,
                    "image": str(self.image), "prompt": self.prompt, "dtype": self.dtype, "label": self.label,
                    "timings": {k: round(v, 4) for k, v in self.timings.items()},
                    "runner_timings": self.runner_timings, "oracle_cached": self.oracle_cached,
                    "oracle_cache": self.oracle_cache, "dumps": self.dumps, "dumps_kept": self.kept,
                    "geometry": self.geometry})
        return out


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


@dataclass
class _Run:
    """One case on its way through the steps of `run_case`: what each step hands the next."""
    spec: CaseSpec
    work: Path
    case: CaseResult
    prog: Any
    label: str
    say: Callable[[str], None]
    use_cache: bool
    adapter: ModelAdapter | None = None
    tols: Any = None
    req: RunRequest | None = None  # the first pass's request (float32 beside a numeric pass)
    ereq: RunRequest | None = None  # the run in its own precision (the numeric pass)
    oreq: RunRequest | None = None
    first: str | None = None  # semantic or direct: the pass that gives `report` (None: numeric alone)
    od: Any = None
    odir: Path | None = None
    edir: Path | None = None
    judge: Judge | None = None

    def timed(self, key: str):
        return timed(self.case.timings, key, self.prog, self.label)


def run_case(spec: CaseSpec, work: Path, *, kept: bool, tolerances=None, use_cache: bool = True,
             local: bool | None = None, views: bool = False, label: str | None = None, prog=None,
             adapter: ModelAdapter | None = None, floor=None, copy_oracle: bool | None = None) -> CaseResult:
    """Oracle (cached), engine, comparison, local error, report views, for one case. `work` holds
    this case's dumps (`oracle/`, `engine/`, `local/`); `kept` says whether it outlives the
    command (if not, the report's notes say its dumps are gone); `copy_oracle` (default: `kept`)
    copies a cached oracle dump into `work/oracle` beside the engine's (`--out`). `tolerances` are
    the user's (a `Tolerances`, a file or None). `spec.passes` says what runs (`PASSES`; none
    given: `default_passes` of the dtype, the model's official one when none is given): the first
    of semantic / direct gives `report`; numeric gives `numeric` (or `report` when it runs alone),
    judged by `floor` = (FloorRule, profile) or the defaults. `local`: each pass's local error
    always (True), or (None) for a pass that diverged, so every fault a pass names has its local
    origin; a pass with a near-tie flip's cascade runs it in any case (what the flip feeds is
    judged there)."""
    label = label or spec.model
    case = CaseResult(spec.model, Path(spec.image) if spec.image else Path(), spec.prompt, spec.dtype or "", label,
                      kept=kept)
    run = _Run(spec, work, case, prog, label, status if prog is None else (lambda msg: None), use_cache)
    rule, profile = floor or (DEFAULT_RULE, {})
    _weights(run, adapter, tolerances)
    _oracle(run, kept if copy_oracle is None else copy_oracle)
    _engine(run)
    _passes(run, rule, profile)
    _notes(run, kept)
    _local_error(run, local, rule)
    if views:
        _views(run)
    _runner_timings(run)
    run.say("")
    return case


def _weights(run: _Run, adapter: ModelAdapter | None, tolerances) -> None:
    """The adapter, the request (every input checked, the weights resolved) and the passes."""
    with run.timed("weights"):
        adapter, spec = run.spec.resolved(adapter)
        adapter, req = spec.request(adapter)
        run.case.image, run.case.dtype = Path(req.image), req.dtype
        run.tols = tolerances if isinstance(tolerances, Tolerances) else load_tolerances(tolerances)
    passes = run.case.passes = tuple(spec.passes)
    run.spec, run.adapter, run.ereq = spec, adapter, req
    run.first = first = next((p for p in passes if p != "numeric"), None)
    if first == "semantic":
        # both sides in float32; a low-precision run's semantic pass in the model's exact numerics
        # (its own numerics, DeepSeek's official bf16 language half, are the numeric pass's to judge)
        req, oracle_dtype = (req if req.dtype == "float32" else exact_request(adapter, req)), "float32"
    elif first == "direct":  # float32 only (`check_passes`)
        oracle_dtype = spec.oracle_dtype
    else:  # numeric alone: its floor run is the oracle the rest compares with
        oracle_dtype = None
    run.req, run.oreq = req, oracle_request(req, oracle_dtype)


def _oracle(run: _Run, copy: bool) -> None:
    """The oracle's dump, from the cache when it holds one (copied beside the engine's for --out)."""
    with run.timed("oracle"):
        run.say(f"running the oracle ({run.spec.model}, {run.oreq.dtype}, {run.oreq.device})…")
        od = run.od = oracle_dump(run.adapter, run.oreq, run.work / "oracle", run.use_cache)
        run.case.oracle_cached, run.case.oracle_cache = od.cached, od.cache
        run.odir = od.path
        if copy and run.odir != run.work / "oracle":  # --out: side by side
            shutil.copytree(run.odir, run.work / "oracle")
            run.odir = run.work / "oracle"


def _engine(run: _Run) -> None:
    """The engine's dump of the first pass's request."""
    req = run.req
    with run.timed("engine"):
        run.say(f"running the engine ({req.backend}, {req.dtype}{', fault ' + req.fault if req.fault else ''})…")
        run.edir = run_side(run.adapter, "engine", req, run.work / "engine")
    run.case.dumps = {"oracle": str(run.odir), "engine": str(run.edir)}
    if run.adapter.geometry:
        run.case.geometry = exercised(run.adapter.geometry, open_dump(run.odir))


def _passes(run: _Run, rule, profile) -> None:
    """The first pass (semantic or direct) on the two dumps, then the numeric pass."""
    case, adapter = run.case, run.adapter
    run.judge = Judge.build(adapter.contract, run.tols, run_dtypes=(run.oreq.dtype, run.req.dtype))
    with run.timed("compare"):
        run.say("comparing…")
        if run.first:
            case.report = compare_dumps(run.odir, run.edir, run.judge)
            # a root no direct hypothesis explains: replay the engine's stage on re-laid inputs
            replay_roots(adapter, run.req, run.odir, run.edir, case.report)
        if "numeric" in case.passes:
            # the semantic pass's oracle is the numeric pass's reference (float32, exact numerics)
            first = run.first
            num = _numeric(adapter, run.ereq, run.odir if first == "semantic" else None,
                           run.odir if not first else None, run.edir if not first else None, run.work,
                           case.kept, run.use_cache, run.tols, (rule, profile), case)
            if first:
                case.numeric = num
            else:
                case.report = num


def _notes(run: _Run, kept: bool) -> None:
    """What the report must say of its dumps: a rejected cache entry, dumps that are gone."""
    if run.od.cache == "rejected":
        run.case.report.notes.append(run.od.note)
    if not kept:
        where = "" if run.odir.is_relative_to(run.work) else f" except the oracle's, kept in the cache at {run.odir}"
        run.case.report.notes.append(TEMPORARY_NOTE.format(cached=where))


def _local_error(run: _Run, local: bool | None, rule) -> None:
    """Each pass's local error where it is wanted: asked for, a near-tie flip's cascade to judge,
    or (by default) a pass that diverged."""
    case, adapter = run.case, run.adapter

    def wanted(r) -> bool:
        cascade = any(b.status == "cascade" for b in r.boundaries)
        return bool(local) or cascade or (local is None and r.verdict != "match")

    if run.first and wanted(case.report):
        with run.timed("local_error"):
            run.say("local error: each engine stage on the oracle's tensors…")
            case.local = (local_error(adapter, run.req, run.odir, case.report, run.judge, run.work,
                                      engine_dir=run.edir)
                          if adapter.stages is not None else unavailable(adapter.name))
    elif run.prog:
        run.prog.done_step()
    num = case.numeric if run.first else case.report if "numeric" in case.passes else None
    if num is None or not wanted(num):
        return
    # the numeric pass's own: the run's engine stages, in its precision, on the float32
    # reference's tensors, each judged three-way against the floor run's error there
    with timed(case.timings, "local_error"):
        run.say("local error of the numeric pass: each engine stage on the reference's tensors, three-way…")
        nlocal = unavailable(adapter.name)
        if adapter.stages is not None:
            # the rule's multipliers, not the clean engine's profile: that measures the whole
            # run's error end to end, which one stage on the reference's tensors is well below
            njudge = Judge.build(adapter.contract, run.tols, run_dtypes=("float32", run.ereq.dtype)).numeric(rule)
            nlocal = local_error(adapter, run.ereq, Path(case.dumps["reference"]), num, njudge, run.work / "numeric",
                                 engine_dir=Path(case.dumps["numeric_engine"]), floor_dir=Path(case.dumps["floor"]))
        if run.first:
            case.local_numeric = nlocal
        else:
            case.local = nlocal


def _views(run: _Run) -> None:
    """The HTML report's heatmaps, drawn while the dumps exist."""
    case = run.case
    with run.timed("report"):
        case.views = heat_views(case.report, open_dump(run.odir))
        if case.numeric is not None:
            case.views += heat_views(case.numeric, open_dump(run.odir))


def _runner_timings(run: _Run) -> None:
    """Each side's own timings, from its dump (not a cached oracle's: those are another run's)."""
    for side, d in (("oracle", run.odir), ("engine", run.edir)):
        if side == "oracle" and run.case.oracle_cached:
            continue
        rt = open_dump(d).run.get("timings")
        if isinstance(rt, dict):
            run.case.runner_timings[side] = rt


def _numeric(adapter, req: RunRequest, ref: Path | None, floor_dir: Path | None, eng: Path | None, work: Path,
             kept: bool, use_cache: bool, tols, floor, case: CaseResult):
    """The numeric pass of one case: the oracle in float32 with the exact numerics (`ref`, when the
    semantic pass has it: `exact_request`) and in the run's dtype with the run's options
    (`floor_dir`, the floor run: the official computation, for DeepSeek the whole model in bf16
    with the language kernels' rounding, the numerics the engine runs too), the engine in the
    run's dtype (`eng`, when run), judged three-way (`floor.three_way`) by `floor` =
    (FloorRule, profile)."""
    rule, profile = floor
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
          views: bool = False, local: bool | None = None) -> CaseResult:
    """`tensordiff check`: one case."""
    out = prepare_out(out)
    with workspace(out, "check", spec.model) as ws:
        ws.hold(run_case(spec, ws.path, kept=True, copy_oracle=ws.out, tolerances=tolerances, use_cache=use_cache,
                         views=views, local=local))
    return ws.cases[0]


# ----------------------------------------------------------------------------- report files

def lone_case(report, dump_a=None, views=None):
    """A report outside a gate (`compare`, `check`) as the one case of a JUnit / HTML file; its
    heatmaps from `views`, or drawn over `dump_a` (the reference dump, opened) when given."""
    case = case_of(report)
    case.views = views if views is not None else (heat_views(report, dump_a) if dump_a is not None else [])
    return case


def write_reports(*, report_json: dict | None = None, json_path=None, cases=(), junit_path=None, html_path=None,
                  title: str = "tensordiff", name: str | None = None) -> None:
    """The report files of a command: the JSON (`report_json`, as the command shapes it), JUnit
    and HTML over `cases`."""
    if json_path and report_json is not None:
        import json


        write_text_atomic(json_path, json.dumps(json_safe(report_json), indent=1) + "\n", "the JSON report")
    if junit_path:
        write_junit(list(cases), junit_path, **({"name": name} if name else {}))
    if html_path:
        write_html(list(cases), html_path, title=title)
