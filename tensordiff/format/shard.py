"""Sharded dumps: a tensor- or expert-parallel run's per-rank tensors seen as whole (logical) ones.

A run of W ranks is either one directory per rank (`DIR/rank0`, `DIR/rank1`, ...; each a valid
dump whose `run.parallel` is `{"rank": r, "world": W}`) or one dump whose entries carry
`"rank": r` (and `run.parallel.world`). An entry says how its rank's tensor makes up the whole:

    "shard": {"axis": A, "index": i, "count": W}   slice i of W along axis A (slices may be uneven)
    "dims": "tokens vocab[tp]"                     the same, the bracketed axis split by rank
    "replicated": true                             every rank holds the whole tensor, bit for bit
    "partial": "sum"                               the whole tensor is the sum over all ranks

The merged tensor is a `MergedTensor`: it quacks like `storage.StoredTensor` (shape, dtype, numel,
reader), so the comparator streams it in its own chunks; a read gathers just that range from
each shard's file (a slice of each row for an inner axis) and never the whole tensor. Structural
faults (shards disagreeing on shape or dtype, a shard missing, two claiming one index) are
`BadInput` naming the ranks; replicas that differ are a divergence (`rank_check`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensordiff.format.dtypes import DType, to_float64
from tensordiff.errors import BadInput
from tensordiff.format.storage import FlatReader, StoredTensor

RANK_DIR = re.compile(r"\Arank(0|[1-9][0-9]*)\Z")
PARALLEL_DIM = re.compile(r"\A([A-Za-z_][A-Za-z0-9_]*)(?:\[([A-Za-z_][A-Za-z0-9_]*)\])?\Z")
KINDS = ("shard", "replicated", "partial")
MAX_WORLD = 4096


@dataclass(frozen=True)
class Layout:
    """How one rank's entry makes up the logical tensor."""

    kind: str  # shard | replicated | partial
    axis: int = 0
    index: int = 0
    count: int = 1

    def as_json(self) -> dict:
        """The manifest fields that state this layout (what `Recorder.record(layout=...)` writes)."""
        if self.kind == "shard":
            return {"shard": {"axis": self.axis, "index": self.index, "count": self.count}}
        return {"replicated": True} if self.kind == "replicated" else {"partial": "sum"}


def rank_dirs(root: Path) -> dict[int, Path]:
    """{rank: DIR/rankN} for the rank dumps under `root` (directories holding a manifest)."""
    out = {}
    for p in root.iterdir() if root.is_dir() else ():
        m = RANK_DIR.match(p.name)
        if m and p.is_dir() and (p / "manifest.json").is_file():
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def is_annotated(t: dict) -> bool:
    """Whether a manifest entry belongs to a sharded run (a dims string without a parallel axis
    is only names)."""
    dims = t.get("dims")
    return any(k in t for k in ("shard", "replicated", "partial", "rank")) or (isinstance(dims, str) and "[" in dims)


def parse_layout(where: str, t: dict, ndim: int, rank: int | None, world: int | None) -> Layout | None:
    """The layout an entry's fields state (None: none), checked; `where` names it in errors."""
    given = [k for k in ("shard", "replicated", "partial") if k in t]
    if "dims" in t and isinstance(t["dims"], str) and "[" in t["dims"]:
        given.append("dims")
    if len(given) > 1:
        raise BadInput(f"{where}: states {' and '.join(given)}; an entry is one of shard, replicated or partial")
    if not given:
        return None
    kind = given[0]
    if kind == "replicated":
        if t["replicated"] is not True:
            raise BadInput(f"{where}: 'replicated' must be true")
        return Layout("replicated")
    if kind == "partial":
        if t["partial"] != "sum":
            raise BadInput(f"{where}: 'partial' is {t['partial']!r}; the one reduction known is \"sum\"")
        return Layout("partial")
    if kind == "dims":
        names = t["dims"].split()
        parsed = [PARALLEL_DIM.match(n) for n in names]
        if len(names) != ndim or not all(parsed):
            raise BadInput(f"{where}: dims {t['dims']!r} must name each of the tensor's {ndim} axes "
                           "(e.g. \"tokens hidden[tp]\")")
        axes = [i for i, m in enumerate(parsed) if m.group(2)]
        if len(axes) != 1:
            raise BadInput(f"{where}: dims {t['dims']!r} marks {len(axes)} parallel axes; one is split by rank")
        if rank is None or world is None:
            raise BadInput(f"{where}: dims {t['dims']!r} splits an axis by rank, but the dump states no "
                           "rank and world (run.parallel)")
        return Layout("shard", axes[0], rank, world)
    s = t["shard"]
    if not isinstance(s, dict) or not all(type(s.get(k)) is int for k in ("axis", "index", "count")):
        raise BadInput(f"{where}: 'shard' must be {{\"axis\": A, \"index\": i, \"count\": W}} with integers")
    axis, index, count = s["axis"], s["index"], s["count"]
    if not 0 <= axis < ndim:
        raise BadInput(f"{where}: shard axis {axis} is not an axis of a {ndim}-d tensor")
    if not (1 <= count <= MAX_WORLD and 0 <= index < count):
        raise BadInput(f"{where}: shard index {index} of count {count} is out of range")
    return Layout("shard", axis, index, count)


@dataclass(frozen=True)
class Part:
    rank: int
    layout: Layout
    stored: StoredTensor
    sha256: str | None


@dataclass(frozen=True)
class MergedTensor:
    """A logical tensor made of rank parts; read like a StoredTensor, never materialised whole."""

    name: str
    kind: str
    axis: int
    parts: tuple[Part, ...]  # shard: in index order; else in rank order
    shape: tuple[int, ...]
    dtype: DType

    @property
    def file(self) -> Path:
        return self.parts[0].stored.file

    @property
    def key(self) -> str:
        ranks = ",".join(str(p.rank) for p in self.parts)
        how = f"shard axis {self.axis}" if self.kind == "shard" else self.kind
        return f"{self.parts[0].stored.key} [{how}, ranks {ranks}]"

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def reader(self) -> FlatReader:
        return MergedReader(self)


class MergedReader(FlatReader):
    """Reads [start, stop) of the logical flattened tensor from the parts' own readers."""

    def __init__(self, t: MergedTensor):
        self.t = t
        self.readers = [p.stored.reader() for p in t.parts]
        shape = t.shape
        self.inner = int(np.prod(shape[t.axis + 1:], dtype=np.int64)) if t.kind == "shard" else 1
        self.sizes = [p.stored.shape[t.axis] for p in t.parts] if t.kind == "shard" else []
        self.offsets = np.cumsum([0] + self.sizes).tolist()
        self.row = self.offsets[-1] * self.inner if t.kind == "shard" else 0  # one outer row, all shards

    def read(self, start: int, stop: int) -> np.ndarray:
        t = self.t
        if t.kind == "replicated":  # a view of the lowest rank's copy: released by `release`
            return self.readers[0].read(start, stop)
        if t.kind == "partial":
            return self._sum(start, stop)
        if stop <= start or self.row == 0:
            return np.zeros(0, dtype=t.dtype.storage)
        if stop - start >= self.row:  # whole outer rows in the middle: one block read per shard
            o0, o1 = start // self.row, -(-stop // self.row)
            blocks = []
            for r, size in zip(self.readers, self.sizes):
                w = size * self.inner
                blocks.append(r.read(o0 * w, o1 * w).reshape(o1 - o0, w))
            merged = np.concatenate(blocks, axis=1).reshape(-1)  # a copy: the shards' pages can go now
            for r, size in zip(self.readers, self.sizes):  # (released before the copy, they would be
                r.release(o0 * size * self.inner, o1 * size * self.inner)  # faulted back in, and stay)
            base = o0 * self.row
            return merged[start - base:stop - base]
        return self._pieces(start, stop)

    def _pieces(self, start: int, stop: int) -> np.ndarray:
        """A range shorter than one outer row: the shard segments it crosses, in order."""
        out, pos = [], start
        while pos < stop:
            o, within = divmod(pos, self.row)
            i = int(np.searchsorted(self.offsets, within // self.inner, side="right")) - 1
            seg_end = self.offsets[i + 1] * self.inner
            n = min(stop - pos, seg_end - within)
            w = self.sizes[i] * self.inner
            a = o * w + within - self.offsets[i] * self.inner
            out.append(np.array(self.readers[i].read(a, a + n)))
            self.readers[i].release(a, a + n)
            pos += n
        return np.concatenate(out) if len(out) > 1 else out[0]

    def _sum(self, start: int, stop: int) -> np.ndarray:
        dt = self.t.dtype
        if not dt.is_float:
            acc = np.zeros(stop - start, dtype=np.int64)
            for r in self.readers:
                acc += r.read(start, stop)
                r.release(start, stop)
            return acc.astype(dt.storage)
        acc = np.zeros(stop - start, dtype=np.float64)
        for r in self.readers:  # in rank order, in float64, rounded once to the stored dtype
            acc += to_float64(r.read(start, stop), dt)
            r.release(start, stop)
        return from_float64(acc, dt)

    def release(self, start: int, stop: int) -> None:
        """The consumer is done with [start, stop): only a replica's read is a view of its file
        (a shard's or a partial's read is a copy, its pages released as it is made)."""
        if self.t.kind == "replicated":
            self.readers[0].release(start, stop)

    def close(self) -> None:
        for r in self.readers:
            r.close()


def from_float64(x: np.ndarray, dt: DType) -> np.ndarray:
    """float64 -> the stored elements of `dt`, rounded to nearest even (bf16 as its bit patterns)."""
    if dt.name != "bfloat16":
        return x.astype(dt.storage)
    bits = x.astype(np.float32).view(np.uint32)
    nan = np.isnan(x)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[nan] = 0x7FC0
    return rounded


@dataclass(frozen=True)
class Tagged:
    """One rank's entry before merging: its name, boundary, storage, layout and digest."""

    name: str
    boundary: str
    rank: int
    layout: Layout | None
    stored: StoredTensor
    sha256: str | None


def merge(source: str, tagged: list[Tagged], world: int) -> list[tuple[str, str, MergedTensor | StoredTensor, str | None]]:
    """Group rank entries by name and merge each group into one logical tensor, in the order the
    names first appear. Returns (name, boundary, stored, sha256) rows; raises BadInput naming the
    ranks for every structural fault."""
    groups: dict[str, list[Tagged]] = {}
    for t in tagged:
        groups.setdefault(t.name, []).append(t)
    out = []
    for name, g in groups.items():
        where = f"{source}: tensor {name!r}"
        ranks = sorted(t.rank for t in g)
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        if dup:
            raise BadInput(f"{where} is recorded twice by rank {dup[0]}")
        kinds = {t.layout.kind if t.layout else None for t in g}
        if None in kinds:
            if len(g) == 1:  # recorded by one rank only, with no layout: a plain tensor
                out.append((name, g[0].boundary, g[0].stored, g[0].sha256))
                continue
            plain = [t.rank for t in g if t.layout is None]
            raise BadInput(f"{where} is recorded by ranks {_ranks(ranks)} but ranks {_ranks(plain)} state no "
                           "layout (shard, dims, replicated or partial)")
        if len(kinds) > 1:
            raise BadInput(f"{where}: ranks disagree on its layout: " +
                           ", ".join(f"rank {t.rank} {t.layout.kind}" for t in sorted(g, key=lambda t: t.rank)))
        boundaries = {t.boundary for t in g}
        if len(boundaries) > 1:
            raise BadInput(f"{where}: ranks disagree on its boundary ({', '.join(sorted(boundaries))})")
        dtypes = {t.stored.dtype.name for t in g}
        if len(dtypes) > 1:
            raise BadInput(f"{where}: shards disagree on dtype: " +
                           ", ".join(f"rank {t.rank} {t.stored.dtype.name}" for t in sorted(g, key=lambda t: t.rank)))
        kind = kinds.pop()
        if kind == "shard":
            out.append((name, g[0].boundary, _merge_shards(where, g), None))
        else:
            out.append((name, g[0].boundary, _merge_whole(where, kind, g, world), None))
    return out


def _ranks(rs) -> str:
    return ", ".join(str(r) for r in sorted(rs))


def _merge_shards(where: str, g: list[Tagged]) -> MergedTensor:
    counts = {t.layout.count for t in g}
    axes = {t.layout.axis for t in g}
    if len(counts) > 1 or len(axes) > 1:
        raise BadInput(f"{where}: ranks disagree on the split: " + ", ".join(
            f"rank {t.rank} axis {t.layout.axis} count {t.layout.count}" for t in sorted(g, key=lambda t: t.rank)))
    count, axis = counts.pop(), axes.pop()
    by_index: dict[int, list[int]] = {}
    for t in g:
        by_index.setdefault(t.layout.index, []).append(t.rank)
    for i, rs in sorted(by_index.items()):
        if len(rs) > 1:
            raise BadInput(f"{where}: ranks {_ranks(rs)} all claim shard {i} of {count}")
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise BadInput(f"{where}: shard {missing[0]} of {count} is missing (ranks {_ranks(t.rank for t in g)} "
                       f"hold shards {_ranks(by_index)})")
    ordered = sorted(g, key=lambda t: t.layout.index)
    ref = ordered[0].stored.shape
    for t in ordered:
        s = t.stored.shape
        if len(s) != len(ref) or any(a != b for k, (a, b) in enumerate(zip(s, ref)) if k != axis):
            raise BadInput(f"{where}: shards disagree on shape: " + ", ".join(
                f"rank {u.rank} {list(u.stored.shape)}" for u in ordered) + f" (all axes but {axis} must agree)")
    shape = list(ref)
    shape[axis] = sum(t.stored.shape[axis] for t in ordered)
    parts = tuple(Part(t.rank, t.layout, t.stored, t.sha256) for t in ordered)
    return MergedTensor(ordered[0].name, "shard", axis, parts, tuple(shape), ordered[0].stored.dtype)


def _merge_whole(where: str, kind: str, g: list[Tagged], world: int) -> MergedTensor:
    ordered = sorted(g, key=lambda t: t.rank)
    shapes = {t.stored.shape for t in ordered}
    if len(shapes) > 1:
        raise BadInput(f"{where}: {kind} copies disagree on shape: " +
                       ", ".join(f"rank {t.rank} {list(t.stored.shape)}" for t in ordered))
    if kind == "partial":
        have = {t.rank for t in ordered}
        missing = [r for r in range(world) if r not in have]
        if missing:
            raise BadInput(f"{where} is a partial sum over {world} ranks but rank {missing[0]} did not record it")
    parts = tuple(Part(t.rank, t.layout, t.stored, t.sha256) for t in ordered)
    return MergedTensor(ordered[0].name, kind, 0, parts, ordered[0].stored.shape, ordered[0].stored.dtype)


def parallel_of(where: str, run: dict) -> tuple[int | None, int | None]:
    """(rank, world) a manifest's `run.parallel` states, checked (None where absent)."""
    p = run.get("parallel") if isinstance(run, dict) else None
    if p is None:
        return None, None
    if not isinstance(p, dict):
        raise BadInput(f"{where}: run.parallel must be an object {{\"rank\": r, \"world\": W}}")
    rank, world = p.get("rank"), p.get("world")
    if world is not None and (type(world) is not int or not 1 <= world <= MAX_WORLD):
        raise BadInput(f"{where}: run.parallel.world {world!r} is not a rank count")
    if rank is not None and (type(rank) is not int or not 0 <= rank < (world or MAX_WORLD)):
        raise BadInput(f"{where}: run.parallel.rank {rank!r} is out of range")
    return rank, world
