"""The calibration file: the one reader and writer of what `tensordiff calibrate` measured.

A calibration file is a tolerance file (`[tolerances]`, derived from the oracle's noise floors
`[floors]`) with the numeric pass's multipliers (`[floor_rule]`), the clean engine's profile
(`[profile.<tensor>.<stat>]`) and what it was measured under (`[calibration]`,
`[calibration.engine]`). `Calibration.to_toml` writes it, `write` checks that it loads, and
`rule_of`, `profile_of`, `engine_of` and `check_engine` read it back for a gate's numeric pass.
"""
from __future__ import annotations

import json
import tomllib
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tensordiff.errors import BadInput
from tensordiff.format.storage import write_text_atomic
from tensordiff.judge.floor import RATIOS, FloorRule, rule_from_mapping
from tensordiff.judge.tolerance import DEFAULTS, file_label, from_mapping, read_toml
from tensordiff.pipeline.options import NO_OPTIONS, parse_assignments


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
    # The numeric pass (tensordiff.judge.floor): the clean engine in the low precision of a dtype
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


def rule_of(path) -> FloorRule:
    """The `[floor_rule]` table of a tolerance / calibration file, else the measured defaults."""
    m = read_toml(path)
    return rule_from_mapping(m.get("floor_rule"), f"{file_label(m, str(path))} [floor_rule]")


def profile_of(path) -> dict:
    """The clean engine's profile of a calibration file: {tensor: {stat: {min, median, max, n}}}."""
    prof = read_toml(path).get("profile") or {}
    if not isinstance(prof, dict):
        raise BadInput(f"{path}: [profile] must be a table")
    for name, stats in prof.items():
        if not isinstance(stats, dict):
            raise BadInput(f"{path}: [profile.{name}] must be a table of statistics")
        for stat, v in stats.items():
            if stat == "equals_floor_run" and isinstance(v, dict) and isinstance(v.get("all"), bool):
                continue
            if (stat not in RATIOS or not isinstance(v, dict) or not {"min", "max", "n"} <= set(v)
                    or not all(isinstance(v[k], (int, float)) and not isinstance(v[k], bool) for k in ("min", "max", "n"))):
                raise BadInput(f"{path}: [profile.{name}.{stat}] must be one of {', '.join(RATIOS)} "
                               "with numbers min, max and n")
    return prof


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
    cal = read_toml(path).get("calibration")
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
    why = engine_mismatch(engine_of(path), engine_record(adapter, backend, device, options))
    cal = read_toml(path).get("calibration")
    was = cal.get("weights") if isinstance(cal, dict) else None
    if weights is not None and isinstance(was, str) and was != weights:
        why = "; ".join(x for x in (f"weights {was} (calibrated) vs {weights} (this gate)", why) if x)
    if why:
        raise BadInput(f"{where}: the engine profile in {path} was calibrated under another engine setup "
                       f"({why}); recalibrate under the gate's, or drop \"numeric\" from passes")


def write(cal: Calibration, path: str | Path) -> Path:
    p = Path(path)
    text = cal.to_toml()
    from_mapping(tomllib.loads(text), str(p))  # what we write must load as a tolerance file
    write_text_atomic(p, text + "\n", "the calibration")
    return p
