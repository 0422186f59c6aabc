"""Import SGLang's dumper output (`sglang.srt.debug_utils.dumper`, `DUMPER_ENABLE=1`).

The dumper writes one file per dumped value, `<dir>/<exp_name>/<tags>.pt`, its tags `key=value`
joined by `___` in this order: `step`, `rank`, `dump_index`, `name`, `recompute_status`, the
call's own keyword tags and the dumper's context (`layer_id`, ...), then, when asked for, the
parallel ranks (`tp_rank`, ...). Older dumpers wrote `forward_pass_id` or `curr_step` for `step`.
Each file is a `torch.save` of `{"value": tensor, "meta": {the tags, "world_rank", "world_size",
"sglang_parallel_info": {"tp_rank", "tp_size", ...}, optional "dims"}}` (the oldest: the bare
value). Its non-intrusive mode (`DUMPER_NON_INTRUSIVE_MODE=all`) hooks every module and names
what it sees `non_intrusive__<module path>.inputs.<i or keyword>[.<key>]` and
`non_intrusive__<module path>.output[.<i or key>]`; those names are kept as they are.

Values are read with `torch.load(weights_only=True)` only: a pickle that would call anything but
the tensor rebuilders is refused (exit 2) before anything is written, and nothing in it runs.

What the import makes of the files:

- names: the dumper's `name`, then any tag beyond the fixed ones as `.key.value`
  (`hidden.layer_id.3`; a `layer_id` the name already carries as `layers.N` is left out); a name
  dumped several times in one step on one rank (same tags) becomes `NAME.call.0`, `NAME.call.1`,
  ...; with several steps the first is the prompt and step S is `NAME.step.(S - first)`, as
  tensordiff names decode steps. `--step` takes one step under the plain names.
- boundaries: what a non-intrusive module returned is the boundary of its path
  (`model.layers.0.mlp`), what it was called with the boundary `PATH.inputs` (the root's:
  `output`, `inputs`); any other name is its own boundary. The chain follows the dumper's order
  (a module's inputs, its children, its output), so the earliest divergence is the module whose
  output diverges while its inputs match, or the inputs of one whose inputs diverge while the
  module before it matched (a computation between modules).
- ranks: one rank, one dump. Several, one rank dump per rank (`OUT/rank0`, ..., in rank order),
  each tensor's `dims` mapped to tensordiff's shard notation (below), so `compare` merges them.

`dims` (the dumper's `dims=`; its comparator's notation): one token per tensor axis, `name`,
`1` (a singleton) or `(a*b)` (fused axes), each optionally followed by `[modifiers]`
(`h[tp]`, `t[cp:zigzag,sp]`, `h[tp:partial]`), then an optional `# ...` declaration
(`tp:replicated`, `dp:=group`); older dumps write `h(tp,partial)`. An axis `X` is split when the
file's parallel info (`sglang_parallel_info` or `megatron_parallel_info`, else the meta itself)
gives `X_rank` / `X_size` with `X_size` > 1 (`ep` on SGLang: `moe_ep_rank` / `moe_ep_size`);
an axis annotated but of size 1 is whole. Mapped per tensor over the ranks holding it:

- no split axis (no `dims`, or only axes of size 1): `replicated` (every rank holds the whole;
  `compare` checks the copies bit for bit and names a rank that differs);
- one split axis `X` on tensor axis A: `shard` {axis: A, index: X_rank, count: X_size}, when the
  ranks holding it are exactly X's ranks 0..X_size-1; with `:partial`: `partial` sum, when every
  imported rank holds it;
- refused (exit 2, the tensor named; `--rank` picks one group): two split axes, zigzag order,
  a data-parallel (`dp:=`) tensor on several ranks, ranks that also differ along another axis.

Skipped with a note, never silently: values that are not tensors (the dumper also saves lists,
dicts, strings) and element types a dump cannot hold (fp8, complex, ...).
"""
from __future__ import annotations

import fnmatch
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensordiff.errors import BadInput
from tensordiff.format.dtypes import BY_NAME
from tensordiff.format.importers import Imported, dump_name

TOOL = "sglang dumper"
PREFIX = "non_intrusive__"
STEP_KEYS = ("step", "curr_step", "forward_pass_id")  # the newest first
FIXED = {"rank", "dump_index", "name", *STEP_KEYS}
RANK_TAGS = {"pp_rank", "tp_rank", "cp_rank", "ep_rank", "etp_rank"}  # include_parallel_rank_in_filename
INFO_KEYS = ("sglang_parallel_info", "megatron_parallel_info")
INT_RE = re.compile(r"\A(0|[1-9][0-9]*)\Z")

_TOKEN = re.compile(r"\A(?:(?P<one>1)|(?P<name>[A-Za-z_]\w*)|\((?P<fused>[^()\[\]]+)\))"
                    r"(?:\[(?P<mods>[^\[\]]*)\]|\((?P<legacy>[^()]*)\))?\Z")
_MOD = re.compile(r"\A(?P<axis>[A-Za-z_]\w*)(?::(?P<quals>[A-Za-z_+]+))?\Z")
QUALIFIERS = {"sharded", "partial", "zigzag", "natural"}


# ----------------------------------------------------------------------------- files


@dataclass(frozen=True)
class DumpFile:
    """One dumper file, as its name tells (nothing read yet)."""

    path: Path
    step: int
    rank: int
    index: int  # dump_index: the dumper's counter, in call order on its rank
    name: str
    tags: tuple[tuple[str, str], ...]  # the other tags, in file-name order


def parse_name(path: Path) -> DumpFile | None:
    """The tags of a dumper file name, or None for a name the dumper would not write."""
    tags: list[list[str]] = []
    for part in path.stem.split("___"):
        k, eq, v = part.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]\w*", k):
            tags.append([k, v])
        elif tags:  # a value holding "___" (a name): the part continues it
            tags[-1][1] += "___" + part
        else:
            return None
    d = dict((k, v) for k, v in tags)
    if len(d) != len(tags):
        return None
    step_key = next((k for k in STEP_KEYS if k in d), None)
    if step_key is None or not all(k in d for k in ("rank", "dump_index", "name")):
        return None
    if not all(INT_RE.match(d[k]) for k in (step_key, "rank", "dump_index")) or not d["name"]:
        return None
    rest = tuple((k, v) for k, v in tags if k not in FIXED)
    return DumpFile(path, int(d[step_key]), int(d["rank"]), int(d["dump_index"]), d["name"], rest)


def find_experiment(d: Path) -> Path:
    """The directory holding the .pt files: DIR itself, or its one experiment (`<dir>/<exp_name>`)."""
    if not d.is_dir():
        raise BadInput(f"{d} is not a directory (give the dumper's <dir>/<exp_name>, or <dir> with one experiment)")
    try:
        if any(p.suffix == ".pt" for p in d.iterdir()):
            return d
        subs = sorted(p for p in d.iterdir() if p.is_dir() and any(q.suffix == ".pt" for q in p.iterdir()))
    except OSError as e:
        raise BadInput(f"cannot list {e.filename or d}: {e.strerror}") from None
    if not subs:
        raise BadInput(f"{d} holds no SGLang dumper files (step=S___rank=R___dump_index=K___name=N.pt), "
                       "directly or in one experiment directory")
    if len(subs) > 1:
        raise BadInput(f"{d} holds {len(subs)} experiments ({', '.join(p.name for p in subs[:5])}); give one of them")
    return subs[0]


def select(exp: Path, *, step: int | None, ranks: tuple[int, ...] | None,
           names: tuple[str, ...] | None) -> list[DumpFile]:
    files = []
    for p in sorted(exp.iterdir()):
        if p.suffix != ".pt":
            continue
        f = parse_name(p)
        if f is None:
            raise BadInput(f"{p} is not named like an SGLang dumper file (step=S___rank=R___dump_index=K___name=N"
                           "[___tag=v...].pt)")
        files.append(f)
    if not files:
        raise BadInput(f"{exp} holds no .pt files")
    steps, all_ranks = sorted({f.step for f in files}), sorted({f.rank for f in files})
    if step is not None and step not in steps:
        raise BadInput(f"{exp} has no step {step} (steps: {_listed(steps)})")
    missing = sorted(set(ranks or ()) - set(all_ranks))
    if missing:
        raise BadInput(f"{exp} has no rank {missing[0]} (ranks: {_listed(all_ranks)})")
    chosen = [f for f in files if (step is None or f.step == step) and (not ranks or f.rank in ranks)
              and (not names or any(fnmatch.fnmatchcase(f.name, g) for g in names))]
    if not chosen:
        asked = " ".join([f"--step {step}"] * (step is not None) + [f"--rank {r}" for r in ranks or ()]
                         + [f"--name {g}" for g in names or ()])
        raise BadInput(f"no file of {exp} matches {asked} (names there: {_listed(sorted({f.name for f in files}))})")
    return sorted(chosen, key=lambda f: (f.rank, f.step, f.index))


def _listed(xs) -> str:
    xs = list(xs)
    return ", ".join(str(x) for x in xs[:12]) + (f", ... ({len(xs)} in all)" if len(xs) > 12 else "")


def load(f: DumpFile) -> tuple[Any, dict]:
    """(value, meta) of one file, through torch.load(weights_only=True) only."""
    import torch

    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols: the refusal below says enough
            warnings.simplefilter("ignore")
            obj = torch.load(f.path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        m = re.search(r"GLOBAL ([\w.]+)", str(e))
        if m is None:  # damaged or foreign bytes, refused by the same unpickler
            raise BadInput(f"{f.path} is not a readable torch.save file (torch.load(weights_only=True) "
                           "refused its pickle)") from None
        raise BadInput(f"{f.path}: refused: its pickle would run code (it calls {m.group(1)}); tensordiff reads "
                       "dumper files only with torch.load(weights_only=True), which rebuilds tensors and plain "
                       "values and nothing else") from None
    except Exception as e:  # noqa: BLE001 - torch's loader on a damaged or foreign file (zip, EOF, runtime)
        raise BadInput(f"{f.path} is not a readable torch.save file ({type(e).__name__})") from None
    if isinstance(obj, torch.Tensor):  # the oldest dumpers saved the bare value
        return obj, {}
    if not isinstance(obj, dict) or "value" not in obj:
        raise BadInput(f"{f.path} holds a {type(obj).__name__}, not the dumper's {{'value': ..., 'meta': ...}}")
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise BadInput(f"{f.path}: its meta is a {type(meta).__name__}, not a table")
    for k, want in (("name", f.name), ("rank", f.rank), ("dump_index", f.index)):
        if k in meta and str(meta[k]) != str(want):
            raise BadInput(f"{f.path}: its meta says {k}={meta[k]!r} but its file name says {want!r} "
                           "(a renamed file?)")
    return obj["value"], meta


# ----------------------------------------------------------------------------- dims


@dataclass(frozen=True)
class Split:
    axis: int  # the tensor axis
    parallel: str  # tp, cp, ep, sp, ...
    quals: frozenset


def parse_dims(where: str, dims: str, ndim: int) -> tuple[list[Split], str]:
    """The parallel splits a dims string states ([] for none) and its declaration part."""
    shape, _, decl = dims.partition("#")
    tokens = shape.split()
    if len(tokens) != ndim:
        raise BadInput(f"{where}: dims {dims!r} names {len(tokens)} axes but the tensor has {ndim}")
    out = []
    for i, tok in enumerate(tokens):
        m = _TOKEN.match(tok)
        if m is None:
            raise BadInput(f"{where}: dims token {tok!r} is not an axis (name, 1, or (a*b), with [modifiers])")
        if m["mods"] is not None:
            for part in m["mods"].split(","):
                mm = _MOD.match(part.strip())
                quals = frozenset(q for q in (mm["quals"] or "").split("+") if q) if mm else None
                if mm is None or not quals <= QUALIFIERS:
                    raise BadInput(f"{where}: dims modifier {part.strip()!r} of {tok!r} is not axis[:qualifier] "
                                   f"(qualifiers: {', '.join(sorted(QUALIFIERS))})")
                out.append(Split(i, mm["axis"], quals))
        elif m["legacy"] is not None:  # older notation: h(tp,partial)
            items = [x.strip() for x in m["legacy"].split(",") if x.strip()]
            axes = [x for x in items if x not in QUALIFIERS]
            if len(axes) > 1:
                raise BadInput(f"{where}: dims token {tok!r} names {len(axes)} parallel axes in the older notation")
            if axes:
                out.append(Split(i, axes[0], frozenset(x for x in items if x in QUALIFIERS)))
    return out, decl


def _info(meta: dict) -> dict:
    for k in INFO_KEYS:
        v = meta.get(k)
        if isinstance(v, dict) and v and not any(str(x).endswith("_error") for x in v):
            return v
    return {}


def axis_position(meta: dict, axis: str) -> tuple[int, int] | None:
    """(rank along `axis`, its size) from a file's meta, or None when the axis is not split."""
    info = _info(meta)
    for src, r_key, s_key in ((info, f"{axis}_rank", f"{axis}_size"), (meta, f"{axis}_rank", f"{axis}_size"),
                              (info, f"moe_{axis}_rank", f"moe_{axis}_size") if axis == "ep" else ({}, "", "")):
        r, s = src.get(r_key), src.get(s_key)
        if type(r) is int and type(s) is int:
            return (r, s) if s > 1 else None
    return None


def layout_of(where: str, held: list[tuple[int, dict, Any]], world: int) -> tuple[dict, bool]:
    """How each rank's part makes up the whole, from the holders' (rank, meta, tensor): the
    layout fields per holder (a dict keyed by rank) and whether dims were absent."""
    dims = {m.get("dims") for _, m, _ in held}
    if len(dims) > 1:
        raise BadInput(f"{where}: ranks disagree on its dims ({', '.join(sorted(map(repr, dims)))})")
    d = dims.pop()
    if d is None:
        return {r: {"replicated": True} for r, _, _ in held}, True
    if not isinstance(d, str):
        raise BadInput(f"{where}: dims {d!r} is not a string")
    per = {}
    for r, meta, t in held:
        splits, decl = parse_dims(where, d, t.dim())
        per[r] = ([s for s in splits if axis_position(meta, s.parallel)], decl, meta)
    live = {len(v[0]) for v in per.values()}
    if len(live) > 1:
        raise BadInput(f"{where}: ranks disagree on which of its axes are split ({d!r})")
    if "dp:=" in per[held[0][0]][1]:
        raise BadInput(f"{where}: a data-parallel tensor ({d!r}) differs by rank and is neither a shard nor a copy; "
                       "import one rank with --rank")
    if live.pop() == 0:
        return {r: {"replicated": True} for r in per}, False
    first = per[held[0][0]][0]
    if len(first) > 1:
        raise BadInput(f"{where}: dims {d!r} splits {len(first)} axes across these ranks "
                       f"({', '.join(s.parallel for s in first)}); tensordiff merges one: import one group with --rank")
    split = first[0]
    if "zigzag" in split.quals:
        raise BadInput(f"{where}: dims {d!r} orders its {split.parallel} shards zigzag, which tensordiff does not "
                       "merge; leave it out with --name")
    pos = {r: axis_position(v[2], split.parallel) for r, v in per.items()}
    sizes = {p[1] for p in pos.values()}
    along = sorted(p[0] for p in pos.values())
    size = sizes.pop() if len(sizes) == 1 else None
    if size is None or along != list(range(size)):
        raise BadInput(f"{where}: ranks {_listed(sorted(pos))} hold {split.parallel} ranks {_listed(along)} "
                       f"of {_listed(sorted({p[1] for p in pos.values()}))}, not each shard once (the ranks also "
                       "differ along another axis, or a shard is missing); import one group with --rank")
    if "partial" in split.quals:
        if len(held) != world or size != world:
            raise BadInput(f"{where}: a partial sum over {split.parallel} ({size} ranks) must be held by every "
                           f"imported rank ({world}); import that group alone with --rank")
        return {r: {"partial": "sum"} for r in per}, False
    return {r: {"shard": {"axis": split.axis, "index": pos[r][0], "count": size}} for r in per}, False


# ----------------------------------------------------------------------------- names


def module_boundary(name: str) -> str | None:
    """The boundary of a non-intrusive name: `PATH.inputs` for what module PATH was called with,
    `PATH` for what it returned (the root's: `inputs`, `output`); None for another name."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX):].split(".")
    out = max((i for i, p in enumerate(parts) if p == "output"), default=-1)
    inp = max((i for i, p in enumerate(parts[:-1]) if p == "inputs"), default=-1)
    if max(out, inp) < 0:
        return None
    if out > inp:
        return ".".join(parts[:out]) or "output"
    return ".".join(parts[:inp + 1])


def tag_parts(f: DumpFile) -> list[str]:
    parts: list[str] = []
    path = f.name.removeprefix(PREFIX).split(".")
    for k, v in f.tags:
        if k in RANK_TAGS or (k == "recompute_status" and v == "disabled"):
            continue
        if k == "layer_id" and any(path[i] == "layers" and path[i + 1] == v for i in range(len(path) - 1)):
            continue  # the non-intrusive dumper's context, already in the module path
        parts += [k, v]
    return parts


@dataclass
class Item:
    file: DumpFile
    value: Any
    meta: dict
    name: str = ""
    boundary: str = ""


def _suffix(base: str, extra: list[str]) -> str:
    return ".".join([base, *extra]) if extra else base


def name_items(items: list[Item]) -> int:
    """Give every item its dump name and boundary (in place); returns the first step."""
    first = min(it.file.step for it in items)
    calls: dict[tuple, list[Item]] = {}
    for it in items:
        tags = tag_parts(it.file)
        it.name = dump_name(_suffix(it.file.name, tags))
        mod = module_boundary(it.file.name)
        it.boundary = dump_name(_suffix(mod, tags)) if mod is not None else it.name
        calls.setdefault((it.file.rank, it.file.step, it.name), []).append(it)
    for group in calls.values():
        if len(group) > 1:
            for k, it in enumerate(sorted(group, key=lambda i: i.file.index)):
                it.name, it.boundary = f"{it.name}.call.{k}", f"{it.boundary}.call.{k}"
    for it in items:
        k = it.file.step - first
        if k:
            it.name, it.boundary = f"{it.name}.step.{k}", f"{it.boundary}.step.{k}"
    return first


def ordered(items: list[Item]) -> list[Item]:
    """One rank's items in the dumper's order: step, then its call counter."""
    return sorted(items, key=lambda it: (it.file.step, it.file.index))


# ----------------------------------------------------------------------------- the import


def read(d: str | Path, *, step: int | None = None, ranks: tuple[int, ...] | None = None,
         names: tuple[str, ...] | None = None) -> list[Imported]:
    """The dumper directory `d` as one `Imported` per rank (one for a single-rank import)."""
    import torch

    d = Path(d)
    exp = find_experiment(d)
    files = select(exp, step=step, ranks=ranks, names=names)
    items, skipped, kinds = [], [], set()
    for f in files:  # everything is read (and refused) before anything is written
        value, meta = load(f)
        if not isinstance(value, torch.Tensor):
            skipped.append(f"{f.name} ({type(value).__name__})")
            continue
        kind = str(value.dtype).replace("torch.", "")
        if kind not in BY_NAME:
            kinds.add(kind)
            skipped.append(f"{f.name} ({kind})")
            continue
        if "dims" in meta:  # checked on every import, used to merge ranks
            if not isinstance(meta["dims"], str):
                raise BadInput(f"{f.path}: dims {meta['dims']!r} is not a string")
            parse_dims(f"{f.path}", meta["dims"], value.dim())
        items.append(Item(f, value.detach(), meta))
    if not items:
        raise BadInput(f"{exp}: no tensor to import among {len(files)} file(s)"
                       + (f" ({', '.join(skipped[:3])})" if skipped else ""))
    first = name_items(items)
    rank_list = sorted({it.file.rank for it in items})
    steps = sorted({it.file.step for it in items})
    facts: dict = {"experiment": exp.name, "first_step": first, "steps": steps, "ranks": rank_list}
    world_sizes = {it.meta.get("world_size") for it in items if type(it.meta.get("world_size")) is int}
    if world_sizes:
        facts["world_size"] = max(world_sizes)
    dims = {it.name: it.meta["dims"] for it in items if isinstance(it.meta.get("dims"), str)}
    if dims:
        facts["dims"] = dims
    notes = []
    if skipped:
        counted = {s: skipped.count(s) for s in skipped}
        notes.append(f"{len(skipped)} dumped value(s) are not tensors a dump can hold and were not imported"
                     + (f" (element types {', '.join(sorted(kinds))})" if kinds else "") + ": "
                     + ", ".join(s + (f" x{n}" if n > 1 else "") for s, n in list(counted.items())[:4]))
    if len(steps) > 1:
        k = "S" if first == 0 else f"(S - {first})"
        notes.append(f"steps {_listed(steps)}: step {first} keeps the plain names, step S is NAME.step.{k}")
    by_rank: dict[int, list[Item]] = {r: [] for r in rank_list}
    for it in items:
        by_rank[it.file.rank].append(it)
    if len(rank_list) == 1:
        (r,) = rank_list
        if facts.get("world_size", 1) > 1:
            notes.append(f"rank {r} of a {facts['world_size']}-rank run: its sharded tensors are its own slices")
        imp = Imported(TOOL, d, notes=notes, facts=facts)
        for it in ordered(by_rank[r]):
            imp.add(it.file.name, it.value, it.boundary, name=it.name)
        return [imp]
    layouts, undimmed, split = _layouts(items, rank_list)
    if split:
        by_rank = {r: [it for it in its if it.name not in split] for r, its in by_rank.items()}
        notes.append(f"{len(split)} tensor(s) without dims hold different shapes on different ranks (split, but the "
                     f"dump does not say how) and were not imported: {', '.join(sorted(split)[:3])}; dump them with "
                     "dims=..., or import one rank with --rank")
    if undimmed:
        notes.append(f"{undimmed} tensor(s) on several ranks carry no dims and were imported as copies every rank "
                     "holds whole (compare names a rank whose copy differs); dump them with dims=... to merge shards")
    out = []
    for i, r in enumerate(rank_list):
        imp = Imported(TOOL, d, notes=list(notes) if i == 0 else [], facts={**facts, "sglang_rank": r})
        for it in ordered(by_rank[r]):
            imp.add(it.file.name, it.value, it.boundary, name=it.name, layout=layouts.get((it.name, r)))
        out.append(imp)
    return out


def _layouts(items: list[Item], rank_list: list[int]) -> tuple[dict[tuple[str, int], dict], int, set[str]]:
    """Each (name, rank)'s layout fields, the count of tensors taken for copies for want of dims,
    and the names without dims whose ranks disagree on the shape (left out)."""
    held: dict[str, list[Item]] = {}
    for it in items:
        held.setdefault(it.name, []).append(it)
    out, undimmed, split = {}, 0, set()
    for name, group in held.items():
        if len(group) == 1:  # one rank's own tensor: plain
            continue
        lay, absent = layout_of(f"tensor {name!r} ({group[0].file.name})",
                                [(it.file.rank, it.meta, it.value) for it in group], len(rank_list))
        if absent and len({tuple(it.value.shape) for it in group}) > 1:
            split.add(name)
            continue
        undimmed += absent
        for r, fields in lay.items():
            out[(name, r)] = fields
    return out, undimmed, split
