"""Tolerances: when is a difference material?

A float tensor diverges when more than `max_mismatch` of its elements fall outside
`|a - b| <= atol + rtol * |a|` (a = the reference side), when its cosine similarity drops below
`min_cosine`, or when NaN/Inf appear on one side only. Integer tensors must be equal; top-k id
tensors must agree as sets per row, with `max_mismatch` the fraction of rows allowed to differ.

Defaults per dtype come from the unit roundoff u = 2**-(mantissa bits + 1) of the NARROWER of the
two dtypes (a bf16 engine against an fp32 oracle is judged in bf16 units):
- bfloat16 (u = 2**-8 = 3.9e-3): rtol = atol = 4u = 1.6e-2 per element, but a deep bf16 tower
  accumulates a few roundings per layer: measured on an H200, the 32-layer DeepSeek vision tower
  in bf16 against the fp32 oracle (synthetic:full, 8,910 patches) puts 4.6% of `final_norm`
  elements beyond 4u with cosine 0.99989. So up to 10% of elements may exceed 4u, and the bulk
  guard is cosine >= 0.999 (a layout or semantics bug drops it far lower). `tensordiff calibrate`
  measures the real floor for tighter gates.
- float16 (u = 4.9e-4): rtol = atol = 4u = 2e-3, 0.1% of elements, cosine >= 0.9999.
- float32 (u = 6e-8): two independent fp32 routes differ by summation order and fused kernels,
  ~1e-6 relative after a few layers; rtol 1e-3, atol 1e-4 leave room for that and for TF32-free
  GEMMs on other hardware, with no element allowed outside and cosine >= 0.99999.
- float64: rtol 1e-7, atol 1e-9.
Overrides: a TOML file (`--tolerances`) or `[tool.tensordiff]` in the nearest pyproject.toml:

    [tolerances.bfloat16]            # a dtype's defaults
    atol = 0.02
    [tolerances.boundaries.aligner]  # a boundary (fnmatch patterns allowed), any dtype
    rtol = 0.05
    [tolerances.boundaries.aligner.float32]   # a boundary at one dtype: wins over both above

A per-boundary value wins over a dtype default; a boundary-at-dtype value wins over both.

Every value carries where it came from (`Tolerance.origins`, `Tolerance.source`): the dtype
default, a user's file or `[tool.tensordiff]` table, a calibration file (one with a
`[calibration]` table, written by `tensordiff calibrate`), or the model's contract
(`Contract.tolerances`, labelled `Contract.tolerances_source`). A report's tolerances line
(`sources_line`) counts the tensors each source judged.

Magnitude-aware atol (`atol_scale = "rms"`): atol is then in units of the reference tensor's
scale, atol_eff = atol x max(1, RMS of A over its finite elements), measured by the comparator in
one extra streamed pass over A (only for tensors that declare it). Why: a long reduction carries
in EVERY element an absolute error of the size of its partial sums, not of the element. Measured
on an H200 (Qwen3-VL synthetic:full-2b, fp32, TF32 off): `logits` = final-norm hidden [S, 2048] .
tied embedding [2048, 151936], |logits| up to 450, RMS 45.7; clean engine against transformers at
cosine 1.000000, SQNR 113 dB, max|d| 7.2e-4, yet 0.023% of elements (the ones near zero) fall
outside atol 1e-4 + rtol 1e-3 |a|. Their error is 2.16e-6 of the logits' RMS: the relative noise
the final hidden state already carries (`hidden.27`: 1.93e-6 of its RMS, fp32 rounding of 28
layers), which the 2048-term reduction spreads, with its own reordering noise, as an ABSOLUTE
error ~ (relative noise) x (output RMS) into every element, near zero or not. rtol scales with
the element and atol not at all, so neither describes it; the tensor's RMS does (max|d| 7.2e-4
against 1e-4 x 45.7 = 4.6e-3: 6x headroom). The element rule is otherwise unchanged (rtol per
element, no element allowed outside in fp32), so an error of 1e-3 of the tensor's RMS on one row,
or a sign flip of one column, still trips. Declared by the Qwen3-VL and DeepSeek language
contracts for `logits`/`logits.step.*` at float32 only; a TOML table may set it too
(`atol_scale = "rms"`, or `"none"` to turn a contract's declaration off). A calibrated atol
(`floor` set) is absolute and never scaled.
"""
from __future__ import annotations

import fnmatch
import math
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tensordiff.errors import BadInput


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    max_mismatch: float = 0.0  # fraction of elements (rows for top-k) allowed outside
    min_cosine: float | None = None
    floor: float | None = None  # measured noise floor (max abs), when calibrated
    source: str = "default"  # where its values came from, in words (`describe_origins`)
    atol_scale: str | None = None  # "rms": atol is in units of max(1, RMS of the reference tensor)
    scale: float | None = None  # that RMS, once the comparator has measured it (never set by a file)
    origins: tuple[tuple[str, str], ...] = ()  # (field, source) of each value not the dtype default's

    @property
    def effective_atol(self) -> float:
        """The atol an element is judged by: `atol`, times max(1, scale) when scaled and measured.
        A calibrated atol (`floor` set: `tensordiff calibrate` derives it from a measured max|d|)
        is already absolute and is never scaled, whatever pattern declares a scale beside it."""
        if self.atol_scale and self.floor is None and self.scale is not None and math.isfinite(self.scale):
            return self.atol * max(1.0, self.scale)
        return self.atol

    def atol_text(self) -> str:
        """The atol as a report line shows it: `0.0001` or `0.0001×max(1, rms(A) 45.7) = 0.00457`."""
        if self.atol_scale and self.floor is not None:
            return f"{self.atol:g} (calibrated: not scaled)"
        if self.atol_scale and self.scale is not None:
            return f"{self.atol:g}×max(1, {self.atol_scale}(A) {self.scale:.4g}) = {self.effective_atol:.4g}"
        if self.atol_scale:
            return f"{self.atol:g}×max(1, {self.atol_scale}(A))"
        return f"{self.atol:g}"

    @classmethod
    def from_dict(cls, d: dict) -> "Tolerance":
        """The inverse of `as_dict` (a report's stored tolerance); unknown keys are ignored, a
        missing atol or rtol reads as 0 (a hand-written or older report may hold only some)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "origins" in kw:  # JSON holds the pairs as lists
            kw["origins"] = tuple(tuple(o) for o in kw["origins"])
        return cls(**{"atol": 0.0, "rtol": 0.0, **kw})

    def as_dict(self) -> dict:
        # every field by name (dataclasses.asdict deep-copies: ~0.1 ms, once per compared tensor)
        return {f.name: getattr(self, f.name) for f in _TOL_FIELDS}


_TOL_FIELDS = fields(Tolerance)

DEFAULTS: dict[str, Tolerance] = {
    "float64": Tolerance(atol=1e-9, rtol=1e-7, max_mismatch=0.0, min_cosine=0.999999999),
    "float32": Tolerance(atol=1e-4, rtol=1e-3, max_mismatch=0.0, min_cosine=0.99999),
    "float16": Tolerance(atol=2e-3, rtol=2e-3, max_mismatch=1e-3, min_cosine=0.9999),
    "bfloat16": Tolerance(atol=1.6e-2, rtol=1.6e-2, max_mismatch=0.1, min_cosine=0.999),
    "int": Tolerance(atol=0.0, rtol=0.0, max_mismatch=0.0),
}
DEFAULTS = {k: replace(v, source=f"default ({k})") for k, v in DEFAULTS.items()}
_FIELDS = {f.name for f in fields(Tolerance)} - {"source", "scale", "origins"}
FRACTIONS = {"max_mismatch": "a fraction of the elements", "min_cosine": "a cosine similarity"}
ATOL_SCALES = ("rms",)  # what `atol_scale` may name ("none" in a file: not scaled)


@dataclass(frozen=True)
class Tolerances:
    dtypes: dict[str, dict[str, Any]]
    boundaries: dict[str, dict[str, Any]]  # pattern -> fields (+ nested dtype tables)
    origin: str = "defaults"  # where the user's tables come from (a file, [tool.tensordiff]) or "defaults"
    sources: dict[str, str] = field(default_factory=dict)  # pattern -> its source when not `origin` (a contract)

    def for_(self, boundary: str, dtype: str) -> Tolerance:
        key = dtype if dtype in DEFAULTS else "int"
        tol = DEFAULTS[key]
        origins: dict[str, str] = {}

        def apply(tol: Tolerance, table: dict, label: str) -> Tolerance:
            origins.update(dict.fromkeys(table, label))
            return replace(tol, **table)

        if key in self.dtypes:
            tol = apply(tol, self.dtypes[key], f"{self.origin} [{key}]")
        for pattern, table in self.boundaries.items():
            if fnmatch.fnmatchcase(boundary, pattern):
                where = self.sources.get(pattern, self.origin)
                flat = {k: v for k, v in table.items() if k in _FIELDS}
                if flat:
                    tol = apply(tol, flat, f"{where} [boundaries.{pattern}]")
                if isinstance(table.get(key), dict):
                    tol = apply(tol, table[key], f"{where} [boundaries.{pattern}.{key}]")
        pairs = tuple(origins.items())
        return replace(tol, origins=pairs, source=describe_origins(pairs, key))


def describe_origins(origins: tuple[tuple[str, str], ...], key: str) -> str:
    """A tolerance's source in words: each source with the fields it set, over the dtype default,
    e.g. `contract qwen3-vl [boundaries.logits.float32] (atol_scale) over default (float32)`."""
    base = f"default ({key})"
    by: dict[str, list[str]] = {}
    for name, label in origins:
        by.setdefault(label, []).append(name)
    if not by:
        return base
    return " + ".join(f"{label} ({', '.join(names)})" for label, names in by.items()) + f" over {base}"


def sources_line(tensors, origin: str = "defaults") -> str:
    """A report's tolerances line: each source and the tensors it judged (counted; a few named
    where it is not a dtype default), and the user's file when none of its tables applied."""
    groups: dict[str, list[str]] = {}
    for t in tensors:
        src = (t.tolerance or {}).get("source")
        if src:
            groups.setdefault(src, []).append(t.name)
    parts = []
    for src, names in groups.items():
        n = f"{len(names)} tensor{'s' if len(names) != 1 else ''}"
        if not src.startswith("default ("):
            n += f" ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
        parts.append(f"{src}: {n}")
    if origin != "defaults" and not any(origin in src for src in groups):
        parts.append(f"{origin}: no table of it applies here")
    return "; ".join(parts) or "none applied (nothing was compared)"


def file_label(mapping: dict, origin: str) -> str:
    """How a tolerance file's values are labelled: `calibration PATH` for a file `tensordiff
    calibrate` wrote (it has a `[calibration]` table), else the file itself."""
    return f"calibration {origin}" if isinstance(mapping.get("calibration"), dict) else origin


def with_contract(tols: Tolerances, tables: dict, source: str = "contract") -> Tolerances:
    """The contract's own per-boundary tables first, so the user's matching tables win; their
    values are labelled `source` (`Contract.tolerances_source`)."""
    if not tables:
        return tols
    checked = {pattern: check_table(t, f"contract tolerances {pattern}") for pattern, t in tables.items()}
    return replace(tols, boundaries={**checked, **tols.boundaries},
                   sources={**{p: source for p in checked if p not in tols.boundaries}, **tols.sources})


def check_table(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise BadInput(f"{where} must be a table")
    out = {}
    for k, v in t.items():
        if k in DEFAULTS and isinstance(v, dict):
            out[k] = check_table(v, f"{where}.{k}")
        elif k == "atol_scale":
            if v not in ATOL_SCALES + ("none",):
                raise BadInput(f"{where}.atol_scale must be one of {', '.join(ATOL_SCALES + ('none',))}, not {v!r}")
            out[k] = None if v == "none" else v
        elif k in _FIELDS:
            # nan compares false with everything (so `v < 0` lets it through) and would make every
            # element pass; inf would too: a tolerance is a finite number >= 0
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0):
                raise BadInput(f"{where}.{k} must be a finite non-negative number, not {v!r}")
            # a fraction and a cosine cannot pass 1: above it every tensor fails (min_cosine) or
            # none ever can (max_mismatch), which no file means to say
            if v is not None and k in FRACTIONS and v > 1:
                raise BadInput(f"{where}.{k} must lie in [0, 1] ({FRACTIONS[k]}), not {v!r}")
            out[k] = float(v) if v is not None else None
        else:
            raise BadInput(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_FIELDS))} or a dtype)")
    return out


def from_mapping(m: dict, origin: str) -> Tolerances:
    outer, m = m, m.get("tolerances", m)
    if not isinstance(m, dict):
        raise BadInput(f"{origin}: [tolerances] must be a table")
    dtypes, bounds = {}, {}
    for k, v in m.items():
        if k == "boundaries":
            if not isinstance(v, dict):
                raise BadInput(f"{origin}: [tolerances.boundaries] must be a table")
            for b, t in v.items():
                bounds[b] = check_table(t, f"{origin}: boundaries.{b}")
        elif k in DEFAULTS:
            dtypes[k] = check_table(v, f"{origin}: {k}")
            dtypes[k] = {kk: vv for kk, vv in dtypes[k].items() if kk in _FIELDS}
        elif k in ("floors", "calibration", "floor_rule", "profile"):
            continue  # written by `tensordiff calibrate`: the report's floors, the numeric pass's rule and profile
        else:
            raise BadInput(f"{origin}: unknown tolerance table {k!r} (a dtype name or 'boundaries')")
    return Tolerances(dtypes, bounds, file_label(outer, origin))


def _text(p: Path) -> str:
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{p} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise BadInput(f"cannot read {p}: {e.strerror}") from None


def read_toml(path) -> dict:
    """The one reader of a tolerance or calibration file: its TOML tables ({} for no file, or for a
    `Judge`/`Tolerances` handed where a path may be)."""
    if path is None or hasattr(path, "for_"):
        return {}
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"tolerance file {p} is a directory; pass the TOML file itself" if p.is_dir()
                       else f"tolerance file {p} does not exist")
    try:
        return tomllib.loads(_text(p))
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{p} is not valid TOML ({e})") from None


def load(path: str | Path | None = None, search_from: Path | None = None) -> Tolerances:
    """Tolerances from an explicit TOML file, else `[tool.tensordiff]` of the nearest pyproject."""
    if path is not None:
        return from_mapping(read_toml(path), str(path))
    here = (search_from or Path.cwd()).resolve()
    for d in (here, *here.parents):
        pp = d / "pyproject.toml"
        if pp.is_file():
            try:
                data = tomllib.loads(_text(pp))
            except (tomllib.TOMLDecodeError, BadInput) as e:
                # not ours to refuse (it may be any project's file), but never silently ignored
                sys.stderr.write(f"tensordiff: warning: {pp} cannot be read ({str(e).splitlines()[0]}); "
                                 "its [tool.tensordiff] tolerances are ignored, the defaults apply\n")
                return Tolerances({}, {}, f"defaults ({pp} unreadable)")
            tool = data.get("tool", {}).get("tensordiff")
            if isinstance(tool, dict) and "tolerances" in tool:
                return from_mapping(tool, f"{pp} [tool.tensordiff]")
            return Tolerances({}, {})
    return Tolerances({}, {})
