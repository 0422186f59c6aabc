"""`tensordiff calibrate`: measure each boundary's noise floor and write tolerances from it.

The floor is how far the ORACLE moves from itself under a change that is not a bug: another
precision (fp32 -> bf16) or another attention kernel (SDPA math -> flash / efficient). Measured
on the gate's images, per boundary and per comparison unit (the narrower dtype of the two sides,
as the comparator judges), a floor becomes a tolerance that is a stated multiple of it:

    atol = multiple × floor (floor = max |Δ| seen, multiple 10 by default),  rtol = 0,
    no element allowed outside,  min_cosine = 1 − multiple × (1 − worst cosine seen) where that
    is looser than the dtype default (else the default)

written as `[tolerances.boundaries.<b>.<dtype>]` with `floor` set, so the report prints every
error also as "× floor". A boundary whose floor cannot be measured (identical in every variant,
missing, or the variant could not run) keeps the dtype default, and the file says so.

Variants (`--variant KEY=VALUE`, repeatable): `dtype=bfloat16|float32` changes the oracle's
dtype; `sdpa=math|flash|efficient|cudnn` runs the oracle under `torch.nn.attention.sdpa_kernel`
with only that kernel allowed (and records it in `RunRequest.options["sdpa"]`, so the oracle
cache keeps them apart); any other key is one of the model's run options that the oracle reads
(`tensordiff options MODEL`; e.g. `attention=eager` for the Qwen3-VL oracle, `processor=pil`),
typed through that table; an unknown or engine-only key is refused.

The engine's profile is measured under the gate case's engine options (`[[model]] options`,
backend, device), and the file records them as `[calibration.engine]`: a profile measured on the
eager engine need not hold for the compiled one (fused segments, CUDA graphs), so a gate whose
numeric pass would judge an engine run under other options by this profile refuses to run
(`check_engine`; on other weights too: a profile does not transfer across weight seeds).
`--repeats N` runs the clean engine N times per image; each profile entry then records
`run_spread` (run-to-run) apart from `image_spread`, and the band covers both.
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import BadInput
from .options import oracle_option
from .storage import write_text_atomic

DEFAULT_VARIANTS = ("dtype=bfloat16",)
# The engine differs from the oracle in every summation order, a variant in only one change (a
# dtype, an attention kernel): measured here, the fp32 engine sits at up to ~5x the eager-vs-SDPA
# floor, a bf16 engine at ~1-2x the fp32-vs-bf16 floor; planted bugs at 10^3-10^6x.
DEFAULT_MULTIPLE = 10.0
SDPA = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


@dataclass(frozen=True)
class Variant:
    key: str
    value: str

    @property
    def label(self) -> str:
        return f"{self.key}={self.value}"


def parse_variant(s: str) -> Variant:
    if "=" not in s:
        raise BadInput(f"--variant {s!r}: expected KEY=VALUE (dtype=bfloat16, sdpa=math, attention=eager, ...)")
    k, v = (x.strip() for x in s.split("=", 1))
    if not k or not v:
        raise BadInput(f"--variant {s!r}: expected KEY=VALUE")
    if k == "dtype" and v not in ("float32", "bfloat16"):
        raise BadInput(f"--variant {s!r}: dtype must be float32 or bfloat16")
    if k == "sdpa" and v not in SDPA:
        raise BadInput(f"--variant {s!r}: sdpa must be one of {', '.join(SDPA)}")
    return Variant(k, v)


@dataclass
class Floor:
    boundary: str
    unit: str  # comparison dtype
    max_abs: float = 0.0
    cosine: float = 1.0
    variant: str = ""  # the variant that set max_abs
    samples: int = 0


@dataclass
class Calibration:
    model: str
    weights: str
    reference: str
    variants: list[str]
    multiple: float
    images: list[str]
    floors: dict[tuple[str, str], Floor] = field(default_factory=dict)
    boundaries: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # variant -> why it could not run
    timings: dict[str, float] = field(default_factory=dict)
    # The numeric pass (tensordiff.floor): the clean engine in the low precision of a dtype
    # variant, three-way against the reference and that variant's oracle, over every image.
    profile: Any = None  # floor.Profile | None
    profile_dtype: str | None = None
    profile_note: str = ""
    engine: dict = field(default_factory=dict)  # engine_record(): what the profile was measured under
    repeats: int = 1

    def measured(self) -> list[Floor]:
        return [f for f in self.floors.values() if f.max_abs > 0 and math.isfinite(f.max_abs)]

    def unmeasured(self) -> dict[str, str]:
        """boundary -> why no floor (for boundaries without any measured unit)."""
        out = {}
        have = {f.boundary for f in self.measured()}
        for b in self.boundaries:
            if b in have:
                continue
            fl = [f for f in self.floors.values() if f.boundary == b]
            if any(not math.isfinite(f.max_abs) for f in fl):
                out[b] = "non-finite difference (NaN/Inf on one side): the dtype default applies"
            elif fl:
                units = ", ".join(sorted({f.unit for f in fl}))
                out[b] = f"identical in every variant (floor 0, {units}): the dtype default applies"
            else:
                out[b] = "no float tensor compared in any variant: the dtype default applies"
        return out

    def tolerance(self, f: Floor) -> dict:
        from .tolerance import DEFAULTS

        d = DEFAULTS.get(f.unit, DEFAULTS["float32"])
        k = self.multiple
        # a cosine floor of exactly 1 says nothing about direction: keep the dtype default there
        # the cosine only ever loosens: near 1 it measures the same tiny errors atol already bounds,
        # and a floor's 1 - 1e-11 times a multiple is tighter than any other route can round
        cos = d.min_cosine
        if f.cosine < 1.0 and (cos is None or 1.0 - k * (1.0 - f.cosine) < cos):
            cos = max(0.0, 1.0 - k * (1.0 - f.cosine))
        return {"atol": k * f.max_abs, "rtol": 0.0, "max_mismatch": 0.0, "min_cosine": cos, "floor": f.max_abs}

    def to_toml(self) -> str:
        q = json.dumps  # a TOML basic string is a JSON string for these characters
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        L = ["# Noise floors measured by `tensordiff calibrate`, and tolerances derived from them.",
             f"# Each tolerance is {self.multiple:g}x the floor: the largest |difference| of the oracle against",
             "# itself under the variants below, per boundary and comparison dtype (atol = multiple x floor,",
             "# rtol = 0, no element outside; min_cosine from the worst cosine seen where looser than the default).",
             "# Boundaries without a measurable floor keep the dtype defaults (see [calibration.unmeasured]).",
             "# Use it as a tolerance file: `tensordiff gate CONFIG` (tolerances = \"this file\"),",
             "# `tensordiff compare A B --tolerances this.toml`.", "",
             "[calibration]", f"model = {q(self.model)}", f"weights = {q(self.weights)}",
             f"reference = {q(self.reference)}", f"variants = [{', '.join(q(v) for v in self.variants)}]",
             f"multiple = {_num(self.multiple)}", f"images = [{', '.join(q(i) for i in self.images)}]",
             f"created = {q(now)}", ""]
        if self.profile is not None and self.engine:
            L += ["# the engine options the profile was measured under: a gate running the engine otherwise",
                  "# refuses this profile (recalibrate under its options)", "[calibration.engine]"]
            L += [f"{q(k)} = {q(v)}" for k, v in self.engine.items()]
            L += [f"repeats = {self.repeats}", ""]
        un = self.unmeasured()
        if un:
            L.append("[calibration.unmeasured]")
            L += [f"{q(b)} = {q(why)}" for b, why in un.items()]
            L.append("")
        if self.failed:
            L.append("[calibration.failed_variants]")
            L += [f"{q(v)} = {q(why)}" for v, why in self.failed.items()]
            L.append("")
        for f in self.measured():
            L += [f"[floors.{q(f.boundary)}.{f.unit}]", f"max_abs = {_num(f.max_abs)}",
                  f"cosine = {_num(f.cosine)}", f"variant = {q(f.variant)}", f"samples = {f.samples}", ""]
        if self.measured():
            L.append("[tolerances]")
            L.append("")
        for f in self.measured():
            t = self.tolerance(f)
            L.append(f"[tolerances.boundaries.{q(f.boundary)}.{f.unit}]")
            L += [f"{k} = {_num(v)}" for k, v in t.items() if v is not None]
            L.append("")
        L += self._profile_toml()
        return "\n".join(L)

    def _profile_toml(self) -> list[str]:
        """[floor_rule] (the numeric pass's multipliers) and [profile.<tensor>.<stat>] (the clean
        engine's ratios to the floor over the images: the gate flags a departure from them)."""
        q = json.dumps
        if self.profile is None:
            return ["# numeric pass: no engine profile (" + (self.profile_note or "no dtype variant") + ")", ""]
        L = [f"# The numeric pass: the clean {self.profile_dtype} engine's error against the reference as multiples",
             "# of the oracle's own in that dtype, over the images above; multipliers are the defaults, raised",
             "# where this engine's own worst clean ratio needs it. The gate flags a ratio outside",
             "# [min - spread, max + spread] of the profile (spread = max - min; two images or more).",
             "[floor_rule]"]
        L += [f"{k} = {_num(v)}" for k, v in self.profile.rule().as_dict().items()]
        L.append(f"# clean engine: {self.profile.images} image(s)"
                 + (f", {len(self.profile.failed)} failing the default rule: " + "; ".join(self.profile.failed)
                    if self.profile.failed else ", all within the default rule"))
        L.append("")
        for name, per in self.profile.summary().items():
            for stat, v in per.items():
                L += [f"[profile.{q(name)}.{stat}]"] + [f"{k} = {_num(x)}" for k, x in v.items()] + [""]
        return L

    def render_text(self) -> str:
        lines = [f"calibration of {self.model} ({self.weights}): reference {self.reference}; "
                 f"variants {', '.join(self.variants)}; tolerance = {self.multiple:g}x floor"]
        if self.profile is not None and self.engine:
            lines.append("engine: " + ", ".join(f"{k}={v}" for k, v in self.engine.items())
                         + (f"; {self.repeats} runs per image" if self.repeats > 1 else ""))
        for v, why in self.failed.items():
            lines.append(f"  variant {v} could not run: {why}")
        for f in sorted(self.floors.values(), key=lambda f: (self.boundaries.index(f.boundary)
                                                                if f.boundary in self.boundaries else 0, f.unit)):
            if f.max_abs > 0 and math.isfinite(f.max_abs):
                t = self.tolerance(f)
                lines.append(f"  {f.boundary:<16} {f.unit:<9} floor max|Δ| {f.max_abs:.3g} (cos {f.cosine:.7f}, "
                             f"{f.variant}) -> atol {t['atol']:.3g}")
        for b, why in self.unmeasured().items():
            lines.append(f"  {b:<16} no floor: {why}")
        if self.profile is not None:
            rule = self.profile.rule()
            lines.append(f"clean {self.profile_dtype} engine over {self.profile.images} image(s), ratio to the floor "
                         f"min/median/max; multipliers {rule.as_dict()}")
            for name, per in self.profile.summary().items():
                lines.append(f"  {name:<16} " + "  ".join(f"{s} {v['min']:.3f}/{v['median']:.3f}/{v['max']:.3f}"
                                                        + (f" (runs ±{v['run_spread']:.2g})" if "run_spread" in v else "")
                                                        for s, v in per.items() if s != "equals_floor_run")
                             + ("  (bit-equal to the floor run: kept exact)" if "equals_floor_run" in per else ""))
            for f in self.profile.failed:
                lines.append(f"  clean engine diverged under the default rule: {f}")
        elif self.profile_note:
            lines.append(f"numeric pass: no engine profile ({self.profile_note})")
        return "\n".join(lines)


def _num(x: float) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    r = repr(float(x))
    return r if ("e" in r or "." in r) else r + ".0"


@contextmanager
def _sdpa_only(name: str | None):
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA[name], None)
    if backend is None:
        raise BadInput(f"this torch has no SDPA backend {name!r}")
    with sdpa_kernel([backend]):
        yield


def _text(v: Any) -> str:
    if v is None:
        return "default"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    return str(v)


def engine_record(adapter, backend: str, device: str, options=()) -> dict[str, str]:
    """What the clean engine's profile depends on, as strings: backend, device kind (cpu, cuda)
    and every option the engine reads, typed with its default filled in (fuse = auto when unset)."""
    from .options import NO_OPTIONS, parse_assignments

    table = getattr(adapter, "options", None) or NO_OPTIONS
    typed = table.parse(parse_assignments(options), adapter.name)
    rec = {"backend": backend, "device": device.split(":", 1)[0]}
    rec.update({k: _text(v) for k, v in table.for_side(typed, "engine").items()})
    return rec


def engine_mismatch(recorded: dict | None, now: dict[str, str]) -> str | None:
    """Why a profile measured under `recorded` must not judge an engine run under `now` (None:
    it may). A file without the record (written before it existed) is not checked."""
    if not recorded:
        return None
    diff = [f"{k} {recorded.get(k, 'default')!s} (calibrated) vs {v} (this gate)"
            for k, v in now.items() if str(recorded.get(k, "default")) != v]
    return "; ".join(diff) or None


def engine_of(path) -> dict | None:
    """The `[calibration.engine]` record of a calibration file (None: none recorded)."""
    from .floor import _read_toml

    cal = _read_toml(path).get("calibration")
    rec = cal.get("engine") if isinstance(cal, dict) else None
    if rec is None:
        return None
    if not isinstance(rec, dict):
        raise BadInput(f"{path}: [calibration.engine] must be a table")
    return {k: str(v) for k, v in rec.items() if k != "repeats"}


def check_engine(path, adapter, backend: str, device: str, options=(), weights: str | None = None,
                 where: str = "gate") -> None:
    """Refuse (BadInput) a profile measured under other engine options, or on other weights, than
    this run's. Weights too: on the CPU (synthetic:tiny, four photographs) the clean engine's
    block0 RMSE ratio on seed-2 weights is 1.003x, outside the seed-0 profile's band
    [0.9972, 1.001]; a profile does not transfer across weights, so it would false-alarm."""
    from .floor import _read_toml

    why = engine_mismatch(engine_of(path), engine_record(adapter, backend, device, options))
    cal = _read_toml(path).get("calibration")
    was = cal.get("weights") if isinstance(cal, dict) else None
    if weights is not None and isinstance(was, str) and was != weights:
        why = "; ".join(x for x in (f"weights {was} (calibrated) vs {weights} (this gate)", why) if x)
    if why:
        raise BadInput(f"{where}: the engine profile in {path} was calibrated under another engine setup "
                       f"({why}); recalibrate under the gate's, or drop \"numeric\" from passes")


def variant_request(req, v: Variant, adapter=None):
    if v.key == "dtype":
        return replace(req, dtype=v.value)
    if v.key == "sdpa" or adapter is None:
        return replace(req, options={**req.options, v.key: v.value})
    name, value = oracle_option(adapter, v.key, v.value, f"--variant {v.label}")  # typed by the model's table
    return replace(req, options={**req.options, name: value})


def calibrate(model: str, images, *, weights: str = "synthetic:tiny", device: str = "cpu",
              dtype: str = "float32", variants=DEFAULT_VARIANTS, multiple: float = DEFAULT_MULTIPLE,
              use_cache: bool = True, echo=None, engine_profile: bool = True, backend: str = "torch",
              options=(), repeats: int = 1) -> Calibration:
    """The oracle at `dtype` (the reference) against itself under each variant, on every image;
    with `engine_profile`, the clean engine in the low precision of the first dtype variant too,
    three-way (tensordiff.floor), for the numeric pass's multipliers and profile: `repeats` runs
    per image under the engine `options` (NAME=VALUE, as a gate's `[[model]] options`)."""
    from . import registry
    from .compare import compare_dumps
    from .metrics import FloatResult
    from .pipeline import oracle_dump, oracle_request
    from .runs import make_request

    if not (isinstance(multiple, (int, float)) and multiple > 0 and math.isfinite(multiple)):
        raise BadInput(f"--multiple must be a positive number, not {multiple!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise BadInput(f"--repeats must be a positive integer, not {repeats!r}")
    vs = [v if isinstance(v, Variant) else parse_variant(v) for v in variants]
    if not vs:
        raise BadInput("calibrate needs at least one --variant")
    for v in vs:
        if v.key == "dtype" and v.value == dtype:
            raise BadInput(f"--variant {v.label} is the reference itself (reference dtype {dtype}); pick the other dtype")
    echo = echo or (lambda s: None)
    adapter = registry.adapter(model)
    for v in vs:  # a runner option is checked against the model's table before anything runs
        if v.key not in ("dtype", "sdpa"):
            oracle_option(adapter, v.key, v.value, f"--variant {v.label}")
    cal = Calibration(model, weights, f"oracle {dtype}, default attention", [v.label for v in vs], float(multiple),
                      [str(i) for i in images], engine=engine_record(adapter, backend, device, options),
                      repeats=repeats)
    order: dict[str, None] = {}
    t0 = time.perf_counter()
    low = next((v for v in vs if v.key == "dtype" and v.value != "float32"), None)
    if engine_profile and low is not None and dtype == "float32":
        from .floor import Profile

        cal.profile, cal.profile_dtype = Profile(), low.value
    elif engine_profile:
        cal.profile_note = ("the reference must be float32 and a variant a lower dtype "
                            f"(reference {dtype}, variants {', '.join(v.label for v in vs)})")
    else:
        cal.profile_note = "not asked for"
    with tempfile.TemporaryDirectory(prefix="tensordiff-calibrate-") as tmp:
        for i, img in enumerate(images):
            _, ereq = make_request(model, image=img, weights=weights, device=device, dtype=dtype, backend=backend,
                                   adapter=adapter, extra=tuple(options))
            req = oracle_request(ereq)
            ref = oracle_dump(adapter, req, Path(tmp) / f"ref-{i}", use_cache).path
            for j, v in enumerate(vs):
                if v.label in cal.failed:
                    continue
                vreq = variant_request(req, v, adapter)
                try:
                    vdir = oracle_dump(adapter, vreq, Path(tmp) / f"var-{i}-{j}", use_cache,
                                       wrap=(lambda v=v: _sdpa_only(v.value)) if v.key == "sdpa" else None).path
                except BadInput:
                    raise
                except RuntimeError as e:  # e.g. no kernel for this backend on this device/shape
                    cal.failed[v.label] = str(e).splitlines()[0][:300]
                    echo(f"variant {v.label} could not run: {cal.failed[v.label]}")
                    continue
                rep = compare_dumps(ref, vdir)
                for b in rep.boundaries:
                    order.setdefault(b.name, None)
                    for t in b.tensors:
                        unit = t.dtype.get("unit")
                        m = t.metrics
                        if unit is None or not isinstance(m, FloatResult):
                            continue
                        f = cal.floors.setdefault((b.name, unit), Floor(b.name, unit))
                        f.samples += 1
                        if not math.isfinite(m.max_abs) or m.max_abs > f.max_abs:
                            f.max_abs, f.variant = (m.max_abs if math.isfinite(m.max_abs) else math.inf), v.label
                        if math.isfinite(m.cosine):
                            f.cosine = min(f.cosine, m.cosine)
                echo(f"{Path(img).name}: {v.label}: measured {len(rep.boundaries)} boundaries")
                if cal.profile is not None and v is low:
                    from .floor import three_way
                    from .runs import run_side

                    for r in range(repeats):
                        edir = run_side(adapter, "engine", replace(ereq, dtype=low.value),
                                        Path(tmp) / f"engine-{i}-{r}")
                        num = three_way(ref, vdir, edir)
                        cal.profile.add(num, Path(img).name, run=r)
                        shutil.rmtree(edir, ignore_errors=True)  # judged: N repeats need no N dumps on disk
                        echo(f"{Path(img).name}: clean {low.value} engine"
                             + (f" (run {r + 1} of {repeats})" if repeats > 1 else "") + f", numeric pass {num.verdict}")
    cal.boundaries = list(order)
    cal.timings["total"] = time.perf_counter() - t0
    if not cal.boundaries and cal.failed:
        raise BadInput("no variant could run: " + "; ".join(f"{k}: {v}" for k, v in cal.failed.items()))
    return cal


def write(cal: Calibration, path: str | Path) -> Path:
    p = Path(path)
    text = cal.to_toml()
    import tomllib

    from .tolerance import from_mapping

    from_mapping(tomllib.loads(text), str(p))  # what we write must load as a tolerance file
    write_text_atomic(p, text + "\n", "the calibration")
    return p
