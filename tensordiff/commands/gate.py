"""`tensordiff gate CONFIG`: the CI gate. Every model × image × prompt of a TOML file runs the
oracle and the engine, is compared boundary by boundary (and stage by stage: local error), and
the build fails with the earliest divergence in its report.

    [gate]
    name = "DeepSeek V4.1 Flash vision"
    images = ["tensordiff:default", "images/"]   # files or folders, relative to this file
    tolerances = "calibration.toml"             # optional; a `tensordiff calibrate` file works

    [[model]]
    name = "deepseek-v4.1-flash"
    weights = "synthetic:tiny"                  # or a checkpoint directory
    dtype = "float32"                           # default: the model's official dtype

Keys under [gate] are defaults for every [[model]]; a model's own keys win (see `KEYS`).
`load_gate` validates everything (names, types, files, images) before anything runs, so a bad
file is one line and exit 2, never a half-run gate.
"""
from __future__ import annotations

import sys
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from tensordiff.errors import BadInput
from tensordiff.pipeline.case import (  # noqa: F401 (re-exported)
    STAGES, CaseResult, CaseSpec, check_weights, prepare_out, run_case, workspace,
)

from tensordiff.pipeline.case import (  # noqa: E402  semantic, numeric, direct (see pipeline.run_case)
    PASSES, carrier_dtype, check_passes, default_passes,
)
from tensordiff.pipeline.runs import run_dtype
from tensordiff.pipeline.calibration import check_engine, profile_of, rule_of
from tensordiff.judge.geometry import Coverage
from tensordiff.judge.tolerance import load, load as load_tolerances
from tensordiff.pipeline import registry
from tensordiff.pipeline.inputs import check_image, default_image_path
from tensordiff.pipeline.options import fault_refusal

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
DEFAULT_IMAGE = "tensordiff:default"

# key -> (type check, description); valid under [gate] (as defaults) and in each [[model]]
KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "weights": (lambda v: isinstance(v, str) and v != "", "a SPEC string (synthetic:tiny, synthetic:full, a checkpoint directory)"),
    "images": (lambda v: isinstance(v, list) and v and all((isinstance(x, str) and x) or _image_list(x) for x in v),
               "a non-empty list of image files or folders, or of lists of image files (several images in one "
               "prompt, in order)"),
    "prompts": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "dtype": (lambda v: v in ("float32", "bfloat16"), "float32 or bfloat16"),
    "oracle_dtype": (lambda v: v in ("float32", "bfloat16"), "float32 or bfloat16"),
    "device": (lambda v: isinstance(v, str) and (v == "cpu" or v.startswith("cuda")), "cpu or cuda[:N]"),
    "backend": (lambda v: v in ("torch", "hip"), "torch or hip"),
    "tolerances": (lambda v: isinstance(v, str) and v != "", "a path to a TOML tolerance or calibration file"),
    "local_error": (lambda v: isinstance(v, bool), "true or false"),
    "chunk": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a positive integer"),
    "decode": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    "layers": (lambda v: isinstance(v, str) and v != "", "a layer subset such as \"0-2\""),
    "options": (lambda v: isinstance(v, dict) and all(isinstance(x, (str, bool, int)) for x in v.values()),
                "a table of run options (NAME = value, as -o NAME=VALUE)"),
    "passes": (lambda v: isinstance(v, list) and v and all(x in PASSES for x in v) and len(set(v)) == len(v),
               "a list of distinct passes: \"semantic\", \"numeric\", \"direct\""),
}
GATE_ONLY = {"name": (lambda v: isinstance(v, str), "a string"), "cache": (lambda v: isinstance(v, bool), "true or false")}
def _image_list(v) -> bool:
    """One case's several images: a list of at least two image files (no folders)."""
    return isinstance(v, list) and len(v) >= 2 and all(isinstance(x, str) and x for x in v)


DEFAULTS = {"weights": "synthetic:tiny", "images": [DEFAULT_IMAGE], "prompts": [], "dtype": None,
            "oracle_dtype": None, "device": "cpu", "backend": "torch", "tolerances": None, "local_error": True,
            "chunk": None, "decode": 0, "passes": None, "layers": None,
            "options": {}}


@dataclass(frozen=True)
class ModelCase:
    """One [[model]] table, defaults applied, paths resolved."""

    name: str
    weights: str
    images: tuple[Path, ...]
    prompts: tuple[str, ...] = ()
    dtype: str | None = None  # None: the model's official dtype (resolved by `run_gate`)
    oracle_dtype: str | None = None
    device: str = "cpu"
    backend: str = "torch"
    tolerances: Path | None = None
    local_error: bool = True
    chunk: int | None = None
    decode: int = 0
    layers: str | None = None  # DeepSeek language backbone: run only these layers ("0-2")
    options: tuple[str, ...] = ()  # NAME=VALUE run options, as `-o`
    passes: tuple[str, ...] | None = None  # None: `case_passes` decides


def case_passes(m: ModelCase) -> tuple[str, ...]:
    """The passes a case runs: as configured, else semantic + numeric for a low-precision run
    (a model's official dtype), semantic alone in float32."""
    if m.passes:
        return tuple(m.passes)
    return default_passes(m.dtype or "float32", m.oracle_dtype)


@dataclass(frozen=True)
class GateConfig:
    path: Path | None
    name: str
    models: tuple[ModelCase, ...]
    cache: bool = True


def _check(table: dict, allowed: dict, where: str) -> None:
    for k, v in table.items():
        if k not in allowed:
            raise BadInput(f"{where}: unknown key {k!r} (known: {', '.join(sorted(allowed))})")
        ok, what = allowed[k]
        if not ok(v):
            raise BadInput(f"{where}: {k} must be {what}, not {v!r}")


def _resolve(base: Path, p: str) -> Path:
    try:
        q = Path(p).expanduser()
    except RuntimeError:  # ~name of no user on this machine
        raise BadInput(f"{p!r}: {p.split('/')[0]} is no user's home directory on this machine") from None
    return q if q.is_absolute() else base / q


def expand_images(specs, base: Path, where: str) -> tuple:
    """Files as given, folders as their image files in name order; every image is validated. A
    list of files is one case of several images, kept as a tuple of paths in its order."""
    out: list = []
    for s in specs:
        if isinstance(s, list):
            group = tuple(p for x in s for p in _one_file(x, base, where))
            out.append(group)
            continue
        if s == DEFAULT_IMAGE:
            out.append(default_image_path())
            continue
        p = _resolve(base, s)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and q.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise BadInput(f"{where}: image folder {p} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise BadInput(f"{where}: image {p} does not exist")
    for p in out:
        for q in p if isinstance(p, tuple) else (p,):
            check_image(q)
    seen: dict = {}
    for p in out:
        seen.setdefault(tuple(q.resolve() for q in p) if isinstance(p, tuple) else p.resolve(), None)
    return tuple(seen)


def _check_image_cases(imgs, prompts, model: str, where: str) -> None:
    """A several-image case needs a model that takes them and a prompt with one `<image>` per
    image: refused when the file is read, not in the middle of the gate."""
    groups = [g for g in imgs if isinstance(g, tuple)]
    if not groups:
        return

    if model in registry.names() and not registry.adapter(model).multi_image:
        raise BadInput(f"{where}: {model} takes one image per prompt; a list of images is a DeepSeek V4.1 Flash case")
    for g in groups:
        if not prompts:
            raise BadInput(f"{where}: a case of {len(g)} images needs prompts with one '<image>' per image")
        for pr in prompts:
            if pr.count("<image>") != len(g):
                raise BadInput(f"{where}: prompt {pr[:40]!r} holds {pr.count('<image>')} '<image>' placeholder(s) "
                               f"but a case lists {len(g)} images; put cases of another image count in a "
                               "[[model]] table of their own")


def _one_file(s: str, base: Path, where: str) -> tuple[Path]:
    """An image of a several-image case: a file (or the default picture), never a folder."""
    if s == DEFAULT_IMAGE:
        return (default_image_path(),)
    p = _resolve(base, s)
    if p.is_dir():
        raise BadInput(f"{where}: {p} is a folder; a list of images (one prompt) takes image files")
    if not p.exists():
        raise BadInput(f"{where}: image {p} does not exist")
    return (p,)


def from_mapping(data: dict, path: Path | None = None, known_models=None) -> GateConfig:
    where = str(path) if path else "gate config"
    base = path.parent if path else Path.cwd()
    top = set(data) - {"gate", "model"}
    if top:
        raise BadInput(f"{where}: unknown table {sorted(top)[0]!r} (a gate file has [gate] and [[model]])")
    gate = data.get("gate", {})
    if not isinstance(gate, dict):
        raise BadInput(f"{where}: [gate] must be a table")
    _check(gate, {**KEYS, **GATE_ONLY}, f"{where} [gate]")
    models = data.get("model")
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
        raise BadInput(f"{where}: needs at least one [[model]] table (with name = \"deepseek-v4.1-flash\" or another model)")
    if known_models is None:
        known_models = registry.names()
    cases = []
    for i, m in enumerate(models):
        w = f"{where} [[model]] #{i + 1}"
        if "name" not in m or not isinstance(m["name"], str):
            raise BadInput(f"{w}: needs name = \"<model>\" (known: {', '.join(known_models) or 'none installed'})")
        _check({k: v for k, v in m.items() if k != "name"}, KEYS, f"{w} ({m['name']})")
        if m["name"] not in known_models:
            raise BadInput(f"{w}: unknown model {m['name']!r} (known: {', '.join(known_models) or 'none installed'})")
        merged = {**DEFAULTS, **{k: v for k, v in gate.items() if k in KEYS}, **m}
        tol = merged["tolerances"]
        tol_path = _resolve(base, tol) if tol else None
        if tol_path is not None:
            load(tol_path)  # validate now: a bad tolerance file must not surface after an hour of runs
        weights = check_weights(merged["weights"], base, w)
        imgs = expand_images(merged["images"], base, w)
        _check_image_cases(imgs, merged["prompts"], m["name"], w)
        cases.append(ModelCase(
            name=m["name"], weights=weights, images=imgs,
            prompts=tuple(merged["prompts"]), dtype=merged["dtype"], oracle_dtype=merged["oracle_dtype"],
            device=merged["device"], backend=merged["backend"], tolerances=tol_path,
            local_error=merged["local_error"], chunk=merged["chunk"], decode=merged["decode"],
            passes=tuple(merged["passes"]) if merged["passes"] else None, layers=merged["layers"],
            options=tuple(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                          for k, v in merged["options"].items())))
    name = gate.get("name") or (path.stem if path else "gate")
    return GateConfig(path, name, tuple(cases), gate.get("cache", True))


def load_gate(path: str | Path, known_models=None) -> GateConfig:
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"gate config {p} does not exist" if not p.exists() else f"gate config {p} is not a file")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{p} is not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{p} is not UTF-8 text") from None
    return from_mapping(data, p, known_models)


# ----------------------------------------------------------------------------- running

@dataclass
class GateResult:
    config: GateConfig
    cases: list[CaseResult]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def coverage(self) -> dict:
        """model -> `geometry.Coverage` of its images (models that declare geometry rules)."""
        out = {}
        for c in self.cases:
            rules = registry.adapter(c.model).geometry
            if rules:
                out.setdefault(c.model, (rules, {}))[1][c.label] = c.geometry
        return {m: Coverage.of(rules, imgs) for m, (rules, imgs) in out.items()}

    def coverage_lines(self) -> list[str]:
        lines = []
        for model, cov in self.coverage().items():
            hit = [r.name for r in cov.rules if r.name not in cov.missing]
            lines.append(f"geometry ({model}): {len(hit)} of {len(cov.rules)} rules exercised"
                         + (f": {', '.join(hit)}" if hit else ""))
            lines.extend(cov.warnings(model))
        return lines

    def breakdown(self) -> dict[str, float]:
        out = {"setup": self.timings.get("setup", 0.0), **{k: 0.0 for k in STAGES}}
        for c in self.cases:
            for k, v in c.timings.items():
                out[k] = out.get(k, 0.0) + v
        out["report"] = out.get("report", 0.0) + self.timings.get("report", 0.0)
        out["total"] = self.timings.get("total", sum(out.values()))
        # inside the runners (when they report run.timings): "oracle.load_weights", "engine.forward", ...
        for c in self.cases:
            for side, rt in c.runner_timings.items():
                for k, v in rt.items():
                    if isinstance(v, (int, float)):
                        out[f"{side}.{k}"] = out.get(f"{side}.{k}", 0.0) + float(v)
        return out

    def as_json(self) -> dict:
        return {"gate": self.config.name, "config": str(self.config.path) if self.config.path else None,
                "verdict": "pass" if self.passed else "fail", "passed": self.passed,
                "failed": [c.label for c in self.cases if not c.passed],
                "geometry": {m: cov.as_json() for m, cov in self.coverage().items()},
                "timings": {k: round(v, 4) for k, v in self.breakdown().items()},
                "cases": [c.as_json() for c in self.cases]}


class _Progress:
    """A rich progress display on a terminal (cases bar + the running stage); silent otherwise."""

    def __init__(self, total: int, enabled: bool, steps: int = len(STAGES) - 1):
        self.p = None
        if enabled:
            from rich.progress import (
                BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn,
            )

            self.p = Progress(SpinnerColumn(), "[progress.description]{task.description}", BarColumn(),
                              MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
            self.cases = self.p.add_task("gate", total=total)
            self.stage = self.p.add_task("", total=steps)

    def __enter__(self):
        if self.p:
            self.p.__enter__()
        return self

    def __exit__(self, *a):
        if self.p:
            self.p.__exit__(*a)

    def case(self, label: str) -> None:
        if self.p:
            self.p.update(self.stage, completed=0, description=f"{label}")

    def step(self, label: str, what: str) -> None:
        if self.p:
            self.p.update(self.stage, description=f"{label}: {what}")

    def done_step(self) -> None:
        if self.p:
            self.p.advance(self.stage)

    def done_case(self) -> None:
        if self.p:
            self.p.advance(self.cases)

    def log(self, line: str) -> None:
        if self.p:
            self.p.console.print(line, markup=False, highlight=False)


def _label(model: str, image, prompt: str | None, dtype: str, base: Path | None, fault: str | None) -> str:
    parts = [model, " + ".join(_image_label(p, base) for p in (image if isinstance(image, tuple) else (image,))),
             dtype]
    if prompt is not None:
        parts.append(f"prompt {prompt[:40]!r}")
    if fault:
        parts.append(f"fault {fault}")
    return " / ".join(parts)


def _image_label(image: Path, base: Path | None) -> str:
    if image == default_image_path().resolve():
        return "default image"
    try:
        return str(image.relative_to(base.resolve())) if base else image.name
    except ValueError:
        return image.name


def _refusal(adapter, fault: str, m, prompt, img=None) -> str | None:
    """Why case (m, prompt) cannot carry `fault` (None: it can): a gate plants a fault only in
    the cases whose model has it and whose run takes its route."""
    return fault_refusal(adapter, fault, prompt=prompt, chunk=m.chunk, decode=m.decode,
                         images=len(img) if isinstance(img, tuple) else 1,
                         dtype=carrier_dtype(case_passes(m), m.dtype))


def run_gate(cfg: GateConfig, *, fault: str | None = None, models: list[str] | None = None, out: Path | None = None,
             use_cache: bool | None = None, local: bool | None = None, overrides: dict | None = None,
             html: bool = False, progress: bool | None = None, echo=None) -> GateResult:
    """Run every case. `overrides` replaces ModelCase fields (device, dtype, weights, backend);
    `fault` plants a named engine fault in every model that has it; `html` computes heatmaps."""
    t_start = time.perf_counter()
    use_cache = cfg.cache if use_cache is None else use_cache
    mcs = [m for m in cfg.models if not models or m.name in models]
    if models:
        unknown = set(models) - {m.name for m in cfg.models}
        if unknown:
            raise BadInput(f"--model {sorted(unknown)[0]!r} is not in {cfg.path or 'the gate'} "
                           f"(it has: {', '.join(m.name for m in cfg.models)})")
    if overrides:
        mcs = [replace(m, **{k: v for k, v in overrides.items() if v is not None}) for m in mcs]
    adapters = {m.name: registry.adapter(m.name) for m in mcs}  # looked up once, used by every case
    # no dtype: the model's official one (what its checkpoint declares), as `check` runs it
    mcs = [replace(m, dtype=run_dtype(adapters[m.name], m.weights, m.dtype)) for m in mcs]
    for m in mcs:
        if "numeric" in case_passes(m) and m.dtype == "float32":
            raise BadInput(f"{m.name}: the numeric pass judges a low-precision run against float32; "
                           "set dtype = \"bfloat16\" (or drop \"numeric\" from passes)")
        check_passes(case_passes(m), m.dtype, m.oracle_dtype, where=f"{m.name}: passes")
    for m in mcs:  # a profile judges only the engine setup it was measured on (eager is not compiled)
        if m.tolerances is not None and "numeric" in case_passes(m):
            if profile_of(m.tolerances):
                check_engine(m.tolerances, adapters[m.name], m.backend, m.device, m.options, m.weights, m.name)
    if fault is not None:
        having = [n for n, a in adapters.items() if any(f.name == fault for f in a.faults)]
        if not having:
            known = sorted({f.name for a in adapters.values() for f in a.faults})
            raise BadInput(f"no model in this gate has a fault {fault!r} (known: {', '.join(known) or 'none'})")
        why = [_refusal(adapters[m.name], fault, m, pr, img) for m in mcs if m.name in having
               for img in m.images for pr in (m.prompts or (None,))]
        if all(why):  # no case would run the bug: a silent pass otherwise
            raise BadInput(f"no case of this gate can carry it: {why[0]}")
    out = prepare_out(out)
    plan = [(m, img, pr) for m in mcs for img in m.images for pr in (m.prompts or (None,))]
    t0 = time.perf_counter()
    for a in adapters.values():  # import the engine (torch, model code) once, outside the per-case clocks;
        a.engine()  # the oracle's code is imported by its first run (none when its dumps are cached)
    setup = time.perf_counter() - t0
    echo = echo or (lambda s: print(s, flush=True))
    show = sys.stderr.isatty() if progress is None else progress
    results: list[CaseResult] = []
    base = cfg.path.parent if cfg.path else None
    tols = {m.tolerances: load_tolerances(m.tolerances) for m in mcs}  # each file read once
    floors = {}  # the numeric pass's rule and profile, per file (read and checked before any case runs)
    for m in mcs:
        if (m.tolerances is not None or "numeric" in case_passes(m)) and m.tolerances not in floors:
            floors[m.tolerances] = (rule_of(m.tolerances), profile_of(m.tolerances))
    with workspace(out, "gate", cfg.name) as ws, \
            _Progress(len(plan), show, steps=len(STAGES) - (0 if html else 1)) as prog:
        where = (f"dumps: {ws.final} (--out)" if ws.out else
                 f"dumps: {ws.final} once the gate ends (this gate's last run, replaced by the next; --out DIR keeps them)")
        prog.log(where) if prog.p else echo(where)
        for i, (m, img, prompt) in enumerate(plan):
            adapter = adapters[m.name]
            f = fault if fault and _refusal(adapter, fault, m, prompt, img) is None else None
            dt = m.dtype if m.oracle_dtype in (None, m.dtype) else f"{m.dtype} (oracle {m.oracle_dtype})"
            label = _label(m.name, img, prompt, dt, base, f)
            prog.case(label)
            work = ws.path / f"case-{i:03d}"
            work.mkdir(parents=True, exist_ok=True)
            imgs = img if isinstance(img, tuple) else (img,)  # a several-image case: one prompt, in order
            spec = CaseSpec(m.name, image=imgs[0], more_images=imgs[1:], weights=m.weights, device=m.device, dtype=m.dtype,
                            oracle_dtype=m.oracle_dtype, backend=m.backend, fault=f, prompt=prompt, chunk=m.chunk,
                            decode=m.decode, extra=m.options, passes=case_passes(m), layers=m.layers)
            case = ws.hold(run_case(spec, work, kept=True, copy_oracle=ws.out, tolerances=tols[m.tolerances],
                                    use_cache=use_cache, local=m.local_error if local is None else local, views=html,
                                    label=label, prog=prog, adapter=adapter, floor=floors.get(m.tolerances)))
            results.append(case)
            prog.done_case()
            line = case.summary_line()
            prog.log(line) if prog.p else echo(line)
    return GateResult(cfg, results, {"setup": setup, "total": time.perf_counter() - t_start})


def render_breakdown(res: GateResult) -> str:
    b = res.breakdown()
    total = b.get("total", 0.0) or 1e-9
    names = {"setup": "setup (imports)", "weights": "weights (resolve)"}
    lines = [f"time per stage ({len(res.cases)} case(s)):"]
    for k, v in b.items():
        if k == "total" or "." in k:
            continue
        inner = [(kk.split(".", 1)[1], vv) for kk, vv in b.items() if kk.startswith(k + ".")]
        detail = f"   ({', '.join(f'{n.replace(chr(95), chr(32))} {x:.3f} s' for n, x in inner)})" if inner else ""
        lines.append(f"  {names.get(k, k.replace('_', ' ')):<18} {v:8.3f} s  {100 * v / total:5.1f}%{detail}")
    lines.append(f"  {'total':<18} {b['total']:8.3f} s")
    return "\n".join(lines)
