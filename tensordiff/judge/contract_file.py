"""A user's contract file (`--contract my_model.toml`): boundaries for any engine's tensor names.

Two implementations of one model rarely name their tensors alike. A contract file names the
boundaries once, says which tensor names of either side stand for each, the DAG between them,
how their rows map to the input, and how they are compared:

    model = "patch-model"                    # the dumps' model (default: the file's stem); plain
                                             # safetensors fit any contract
    inputs = { grid = [3, 5] }                # for the row layouts, where a dump does not record it

    [boundaries.patches]
    tensors = ["patchify", "patches.flat"]   # tensor-name patterns; either side's names
    layout = "grid"                           # rows: patches of run.inputs.grid (tensordiff.judge.contract)
    inputs = []                               # a root

    [boundaries."hidden.{L}"]                # {L}: a layer index, read from the tensor name
    tensors = ["blocks.{L}", "layer{L}.out"]
    inputs = ["hidden.{L-1}", "patches"]      # hidden.-1 names no boundary: hidden.0 reads patches only
    mode = "values"                           # values | exact | topk-sets | scores
    tolerance = { rtol = 1e-3, atol = 1e-4 }  # as a tolerance file's [tolerances.boundaries.X]

    [boundaries.rope]                         # several tensors: canonical name -> patterns
    tensors = { "rope.cos" = "rotary.cos", "rope.sin" = ["rotary.sin", "sin"] }

Patterns match whole names: `{X}` is a non-negative integer (the same value names the
boundary), `*` any run of characters. The first boundary (in file order) with a matching
pattern takes a tensor. Boundaries come in file order, a templated one by its index; without
`inputs` a boundary is fed by the one before it (a chain). A tensor no boundary names is left
out of the comparison, with a note in the report; a contract that names no tensor of a dump is
refused. Every mistake is one line naming the file and the key (`BadInput`, exit 2).
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from tensordiff.format.capture import NAME_RE
from tensordiff.judge.contract import (
    LAYOUTS, MODES, Boundary, Contract, ContractError, TensorRule, topological,
)
from tensordiff.format.dump import Dump, Entry
from tensordiff.errors import BadInput, IncomparableDumps
from tensordiff.judge.probes import PROBES
from tensordiff.judge.tolerance import check_table

PLAIN_MODEL = "plain"  # tensordiff.format.plain.MODEL: a dump that names no model fits any contract
TOP_KEYS = ("model", "inputs", "boundaries")
# What a contract may say about the input, for the row layouts (tensordiff.judge.layout): a dump that
# does not record it (plain safetensors) takes it from the contract.
INPUT_KEYS = ("grid", "cells")
BOUNDARY_KEYS = ("tensors", "inputs", "layout", "mode", "meaning", "probes", "tolerance")
PLACE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
INPUT_PLACE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:([+-])(\d+))?\}")


def _fail(where: str, msg: str) -> ContractError:
    return ContractError(f"{where}: {msg}")


def _pattern_re(pattern: str, where: str) -> re.Pattern:
    out, pos = [], 0
    for m in PLACE.finditer(pattern):
        out.append(_literal(pattern[pos:m.start()]))
        out.append(f"(?P<{m[1]}>0|[1-9][0-9]*)")
        pos = m.end()
    out.append(_literal(pattern[pos:]))
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error as e:  # a placeholder used twice in one pattern
        raise _fail(where, f"pattern {pattern!r} is not usable ({e})") from None


def _literal(s: str) -> str:
    return ".*".join(re.escape(part) for part in s.split("*"))


@dataclass(frozen=True)
class TensorSpec:
    """One canonical tensor of a boundary and the names either side may give it."""

    canonical: str  # may hold the boundary's placeholders
    patterns: tuple[str, ...]
    regexes: tuple[re.Pattern, ...] = field(compare=False, default=())


@dataclass(frozen=True)
class BoundarySpec:
    name: str  # may hold placeholders: "hidden.{L}"
    places: tuple[str, ...]
    tensors: tuple[TensorSpec, ...]
    inputs: tuple[str, ...] | None  # None: the previous boundary (a chain)
    layout: str = "plain"
    mode: str | None = None
    meaning: str = ""
    probes: tuple[str, ...] = ()
    tolerance: dict = field(default_factory=dict, compare=False)

    def concrete(self, values: dict[str, int]) -> str:
        return PLACE.sub(lambda m: str(values[m[1]]), self.name)


@dataclass(frozen=True)
class ContractFile:
    path: Path
    model: str
    boundaries: tuple[BoundarySpec, ...]
    inputs: dict = field(default_factory=dict)  # e.g. {"grid": [h, w]}, for dumps that lack it

    # ------------------------------------------------------------------ naming the tensors

    def name_of(self, tensor: str) -> tuple[str, str, BoundarySpec, dict[str, int]] | None:
        """(canonical tensor name, boundary name, spec, placeholder values), or None."""
        for b in self.boundaries:
            for t in b.tensors:
                for rx in t.regexes:
                    m = rx.match(tensor)
                    if m:
                        vals = {k: int(v) for k, v in m.groupdict().items()}
                        canon = PLACE.sub(lambda mm: str(vals[mm[1]]), t.canonical)
                        return canon, b.concrete(vals), b, vals
        return None

    def bind(self, da: Dump, db: Dump) -> tuple[Dump, Dump, Contract, list[str]]:
        """Both dumps renamed to the contract's names, the concrete contract, and report notes."""
        notes = []
        found: dict[str, tuple[BoundarySpec, dict[str, int]]] = {}
        out = []
        for side, d in (("A", da), ("B", db)):
            if d.model not in (self.model, PLAIN_MODEL):
                raise IncomparableDumps(f"{d.path} is a {d.model!r} dump but the contract {self.path} is for "
                                        f"{self.model!r} (set `model = \"{d.model}\"` in it if it fits)")
            entries, left, seen = [], [], {}
            for e in d.entries:
                hit = self.name_of(e.name)
                if hit is None:
                    left.append(e.name)
                    continue
                canon, bname, spec, vals = hit
                if canon in seen:
                    raise BadInput(f"{self.path}: tensors {seen[canon]!r} and {e.name!r} of {d.path} both stand "
                                   f"for {canon!r}; make the patterns of boundary {spec.name!r} tell them apart")
                seen[canon] = e.name
                found.setdefault(bname, (spec, vals))
                entries.append(Entry(canon, bname, e.stored, e.sha256))
            if not entries:
                raise BadInput(f"{self.path}: no boundary of the contract names any tensor of {d.path} "
                               f"(its tensors: {', '.join(d.names[:6])}{', ...' if len(d.names) > 6 else ''})")
            if left:
                notes.append(f"side {side}: {len(left)} tensor(s) the contract names no boundary for were left out: "
                             f"{', '.join(left[:5])}{', ...' if len(left) > 5 else ''}")
            run = d.run
            missing = {k: v for k, v in self.inputs.items() if k not in (run.get("inputs") or {})}
            if missing:
                run = {**run, "inputs": {**(run.get("inputs") or {}), **missing}}
            out.append(replace(d, model=self.model, entries=tuple(entries), run=run))
        return out[0], out[1], self._contract(found), notes

    def _contract(self, found: dict[str, tuple[BoundarySpec, dict[str, int]]]) -> Contract:
        order = {id(b): i for i, b in enumerate(self.boundaries)}
        names = sorted(found, key=lambda n: (order[id(found[n][0])], sorted(found[n][1].items())))
        bounds, rules, tols = [], [], {}
        for i, n in enumerate(names):
            spec, vals = found[n]
            if spec.inputs is None:
                inputs = (names[i - 1],) if i else ()
            else:
                inputs = tuple(x for x in (_expand(inp, vals) for inp in spec.inputs) if x is not None)
            bounds.append(Boundary(n, inputs=inputs, meaning=spec.meaning, layout=spec.layout, probes=spec.probes))
            if spec.mode:
                for t in spec.tensors:
                    rules.append(TensorRule(PLACE.sub(lambda m: str(vals[m[1]]), t.canonical), spec.mode))
            if spec.tolerance:
                tols[n] = spec.tolerance
        try:  # `{L+1}` inputs can still close a cycle among instances
            topological(bounds)
        except ValueError as e:
            raise BadInput(f"{self.path}: {e}") from None
        return Contract(self.model, tuple(bounds), tuple(rules), tolerances=tols,
                        tolerances_source=f"contract file {self.path}")


def _expand(inp: str, vals: dict[str, int]) -> str | None:
    """An input reference with this boundary's values; None where an index falls below 0."""
    bad = False

    def sub(m):
        nonlocal bad
        v = vals[m[1]] + (int(m[3]) if m[2] == "+" else -int(m[3]) if m[2] else 0)
        bad |= v < 0
        return str(v)

    s = INPUT_PLACE.sub(sub, inp)
    return None if bad else s


# ---------------------------------------------------------------------------- loading

def load(path: str | Path) -> ContractFile:
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"contract file {p} is a directory; pass the TOML file itself" if p.is_dir()
                       else f"contract file {p} does not exist")
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadInput(f"{p} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{p} is not valid TOML ({e})") from None
    except OSError as e:
        raise BadInput(f"cannot read {p}: {e.strerror}") from None
    return parse(data, p)


def parse(data: dict, p: Path) -> ContractFile:
    for k in data:
        if k not in TOP_KEYS:
            raise _fail(f"{p}", f"unknown key {k!r} (known: {', '.join(TOP_KEYS)})")
    model = data.get("model", p.stem)
    if not isinstance(model, str) or not model.strip() or not model.isprintable():
        raise _fail(f"{p}: model", f"must be a non-empty one-line string, not {model!r}")
    table = data.get("boundaries")
    if not isinstance(table, dict) or not table:
        raise _fail(f"{p}", "needs a [boundaries.NAME] table for at least one boundary")
    specs = [_boundary(name, t, f"{p}: boundaries.{name}") for name, t in table.items()]
    for s in specs:
        for inp in s.inputs or ():
            where = f"{p}: boundaries.{s.name}.inputs"
            for m in INPUT_PLACE.finditer(inp):
                if m[1] not in s.places:
                    raise _fail(where, f"{inp!r} uses {{{m[1]}}}, which the boundary's name {s.name!r} does not define")
            target = _target(specs, inp)
            if target is None:
                raise _fail(where, f"{inp!r} names no boundary of this file (boundaries: {', '.join(x.name for x in specs)})")
            if target is s and not INPUT_PLACE.search(inp):
                raise _fail(where, f"boundary {s.name!r} cannot be its own input")
    _check_acyclic(specs, p)
    return ContractFile(p, model, tuple(specs), _inputs(data.get("inputs", {}), f"{p}: inputs"))


def _inputs(v, where: str) -> dict:
    if not isinstance(v, dict):
        raise _fail(where, "must be a table, e.g. { grid = [24, 40] }")
    for k, x in v.items():
        if k not in INPUT_KEYS:
            raise _fail(where, f"unknown key {k!r} (known: {', '.join(INPUT_KEYS)})")
        if not (isinstance(x, list) and len(x) == 2 and all(type(n) is int and n > 0 for n in x)):
            raise _fail(f"{where}.{k}", f"must be [height, width] in positive integers, not {x!r}")
    return dict(v)


def _boundary(name: str, t, where: str) -> BoundarySpec:
    if not isinstance(t, dict):
        raise _fail(where, "must be a table")
    for k in t:
        if k not in BOUNDARY_KEYS:
            raise _fail(where, f"unknown key {k!r} (known: {', '.join(BOUNDARY_KEYS)})")
    places = tuple(PLACE.findall(name))
    bare = PLACE.sub("0", name)
    if not NAME_RE.match(bare) or ".." in bare or len(set(places)) != len(places):
        raise _fail(where, "a boundary name is letters, digits, '_', '-', single '.', and {X} placeholders, each once")
    tensors = _tensors(t.get("tensors"), name, places, f"{where}.tensors")
    inputs = t.get("inputs")
    if inputs is not None and (not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs)):
        raise _fail(f"{where}.inputs", "must be a list of boundary names, e.g. [\"patches\"] ([] for a root)")
    layout = t.get("layout", "plain")
    if layout not in LAYOUTS:
        raise _fail(f"{where}.layout", f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    mode = t.get("mode")
    if mode is not None and mode not in MODES:
        raise _fail(f"{where}.mode", f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    meaning = t.get("meaning", "")
    if not isinstance(meaning, str):
        raise _fail(f"{where}.meaning", "must be a string")
    probes = t.get("probes", [])
    if not isinstance(probes, list) or not all(isinstance(x, str) and x in PROBES for x in probes):
        raise _fail(f"{where}.probes", f"must be a list of probes (known: {', '.join(PROBES)}), not {probes!r}")
    tol = t.get("tolerance", {})
    try:
        tol = check_table(tol, f"{where}.tolerance") if tol != {} else {}
    except BadInput as e:
        raise ContractError(str(e)) from None
    return BoundarySpec(name, places, tensors, tuple(inputs) if inputs is not None else None, layout, mode,
                        meaning, tuple(probes), tol)


def _tensors(v, bname: str, places: tuple[str, ...], where: str) -> tuple[TensorSpec, ...]:
    if isinstance(v, (str, list)):
        v = {bname: v}
    if not isinstance(v, dict) or not v:
        raise _fail(where, "must be a pattern, a list of patterns, or a table {canonical name = patterns}")
    out = []
    for canon, pats in v.items():
        pats = [pats] if isinstance(pats, str) else pats
        if not isinstance(pats, list) or not pats or not all(isinstance(x, str) and x for x in pats):
            raise _fail(f"{where}.{canon}" if canon != bname else where, "needs one or more non-empty patterns")
        if set(PLACE.findall(canon)) != set(places) or not NAME_RE.match(PLACE.sub("0", canon)):
            raise _fail(where, f"tensor name {canon!r} must be a name holding exactly the placeholders of {bname!r}")
        for pat in pats:
            if set(PLACE.findall(pat)) != set(places):
                want = ", ".join(f"{{{x}}}" for x in places) or "no placeholder"
                raise _fail(where, f"pattern {pat!r} must hold {want}, as the boundary's name does")
        out.append(TensorSpec(canon, tuple(pats), tuple(_pattern_re(x, where) for x in pats)))
    return tuple(out)


def _target(specs: list[BoundarySpec], inp: str) -> BoundarySpec | None:
    """The boundary an input reference names: a template by its shape ("hidden.{L-1}"), or one
    instance of a template ("block.1"), or a plain boundary."""
    shape = INPUT_PLACE.sub("{}", inp)
    for x in specs:
        if PLACE.sub("{}", x.name) == shape:
            return x
    if INPUT_PLACE.search(inp):
        return None
    return next((x for x in specs if x.places and _pattern_re(x.name, x.name).match(inp)), None)


def _check_acyclic(specs: list[BoundarySpec], p: Path) -> None:
    """Explicit inputs between templates, with no index arithmetic, must form no cycle (an
    `{L-1}` reference always points to an earlier instance; cycles among instances are caught
    when the contract is bound)."""
    def same_index(inp: str) -> str | None:
        """The template an input names at the same index ("hidden.{L}", "embed"), else None."""
        t = _target(specs, inp)
        shifted = any(m[2] for m in INPUT_PLACE.finditer(inp))
        one_instance = t is not None and t.places and not INPUT_PLACE.search(inp)
        return None if t is None or shifted or one_instance else t.name

    edges = {s.name: [e for e in map(same_index, s.inputs or ()) if e] for s in specs}
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            cyc = path[path.index(n):] + [n]
            raise _fail(f"{p}: boundaries.{n}.inputs", f"the inputs form a cycle: {' -> '.join(cyc)}")
        state[n] = 1
        for m in edges[n]:
            visit(m, path + [n])
        state[n] = 2

    for s in specs:
        visit(s.name, [])
