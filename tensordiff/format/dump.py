"""Reading a dump directory (format v1): the manifest and lazy handles on its tensors.

Opening a dump parses `manifest.json` and the tensor files' headers; no tensor data is read.
Everything in a manifest is untrusted: names and files are validated, paths cannot leave the
directory, and only safetensors, HDF5 and JSON are ever opened.
"""
from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tensordiff.format import shard
from tensordiff.format.capture import FORMAT, NAME_RE, default_boundary
from tensordiff.format.dtypes import BY_NAME, to_float64
from tensordiff.errors import BadInput
from tensordiff.format.storage import (
    PICKLE_EXT, StoredTensor, file_kind, plain_hdf5_entry, read_hdf5_entry, read_safetensors_header,
)
from tensordiff.format.hdf5_layout import Layout
from tensordiff.format.storage import H5_ERRORS

MAX_MANIFEST = 64 * 1024 * 1024
SHA256_RE = re.compile(r"\A[0-9a-fA-F]{64}\Z")


@dataclass(frozen=True)
class Entry:
    name: str
    boundary: str
    stored: StoredTensor
    sha256: str | None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stored.shape

    @property
    def dtype(self):
        return self.stored.dtype

    def computed_sha256(self) -> str:
        """sha256 of the stored elements, read in bounded chunks (compare with `sha256`)."""
        import hashlib

        h = hashlib.sha256()
        r = self.stored.reader()
        try:
            for s in range(0, self.stored.numel, 1 << 22):
                h.update(r.read(s, min(self.stored.numel, s + (1 << 22))).tobytes())
        finally:
            r.close()
        return h.hexdigest()


@dataclass(frozen=True)
class Dump:
    path: Path
    model: str
    producer: dict
    run: dict
    entries: tuple[Entry, ...]
    world: int | None = None  # a sharded run's rank count (its entries merged: `shard`), else None

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    @property
    def nbytes(self) -> int:
        return sum(e.stored.nbytes for e in self.entries)

    def boundaries(self) -> list[str]:
        """Boundary names in the order the producer first recorded them."""
        seen: dict[str, None] = {}
        for e in self.entries:
            seen.setdefault(e.boundary, None)
        return list(seen)

    def load(self, name: str):
        """One tensor as a numpy array (float types widened to float32; bf16 exactly)."""
        import numpy as np


        e = self.entry(name)
        r = e.stored.reader()
        try:
            raw = r.read(0, e.stored.numel)
        finally:
            r.close()
        if e.dtype.is_float:
            return to_float64(raw, e.dtype).astype(np.float32 if e.dtype.name != "float64" else np.float64).reshape(e.shape)
        return raw.reshape(e.shape)


def _inside(root: Path, rel: str, what: str, root_resolved: Path | None = None) -> Path:
    if isinstance(rel, str) and rel and not rel.isprintable():
        raise BadInput(f"{root}/manifest.json: {what} {rel!r} has a control character (NUL, newline, ...); "
                       "a file name in a dump is one line of printable characters")
    if not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")) or ".." in Path(rel).parts or ":" in rel:
        raise BadInput(f"{root}/manifest.json: {what} {rel!r} escapes the dump directory")
    p = (root / rel).resolve()
    try:
        p.relative_to(root_resolved or root.resolve())
    except ValueError:
        raise BadInput(f"{root}/manifest.json: {what} {rel!r} escapes the dump directory") from None
    return p


def open_dump(path: str | Path) -> Dump:
    """A dump directory; a sharded run (rank directories, or rank-tagged entries) is returned with
    its tensors merged into logical ones (`shard`)."""
    root = Path(path)
    if not root.exists():
        raise BadInput(f"{root} does not exist")
    if root.is_dir() and not (root / "manifest.json").exists():
        ranks = shard.rank_dirs(root)
        if ranks:
            return _open_ranks(root, ranks)
    d, tagged = _open_one(root)
    if not any(t is not None for t in tagged):
        return d
    _, world = shard.parallel_of(str(root / "manifest.json"), d.run)
    if world is None:
        raise BadInput(f"{root / 'manifest.json'}: entries carry ranks or layouts but run.parallel.world is not given")
    for t in tagged:
        if t is not None and (t.rank is None or not 0 <= t.rank < world):
            raise BadInput(f"{root / 'manifest.json'}: tensor {t.name!r} has rank {t.rank!r}, not one of 0..{world - 1}")
    return _merged(d, [t for t in tagged if t is not None], world,
                   [e for e, t in zip(d.entries, tagged) if t is None])


def _open_ranks(root: Path, ranks: dict[int, Path]) -> Dump:
    """`root/rank0`, `root/rank1`, ...: each a dump of one rank, merged into one logical dump."""
    dumps = {}
    tagged: list[shard.Tagged] = []
    world = None
    for r, p in ranks.items():
        d, tags = _open_one(p)
        where = str(p / "manifest.json")
        rank, w = shard.parallel_of(where, d.run)
        if w is None or rank != r:
            raise BadInput(f"{where}: run.parallel must state {{\"rank\": {r}, \"world\": W}} for {p.name}")
        if world is not None and w != world:
            raise BadInput(f"{root}: ranks disagree on the world size ({world} and {w} in {p.name})")
        world = w
        for e, t in zip(d.entries, tags):
            if t is not None and t.rank != r:
                raise BadInput(f"{where}: tensor {e.name!r} says rank {t.rank}, but it is in {p.name}/")
            lay = t.layout if t is not None else None
            tagged.append(shard.Tagged(e.name, e.boundary, r, lay, e.stored, e.sha256))
        dumps[r] = d
    missing = [r for r in range(world) if r not in dumps]
    if missing:
        raise BadInput(f"{root}: the run has {world} ranks but rank{missing[0]}/ is missing")
    extra = [r for r in dumps if r >= world]
    if extra:
        raise BadInput(f"{root}: rank{extra[0]}/ is beyond the world size {world}")
    models = {d.model for d in dumps.values()}
    if len(models) > 1:
        raise BadInput(f"{root}: rank dumps disagree on the model ({', '.join(sorted(models))})")
    first = dumps[0]
    return _merged(Dump(root, first.model, first.producer, first.run, ()), tagged, world, [])


def _merged(d: Dump, tagged: list, world: int, plain: list[Entry]) -> Dump:
    rows = shard.merge(str(d.path), tagged, world)
    entries = [Entry(n, b, st, sha) for n, b, st, sha in rows] + plain
    names = [e.name for e in entries]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise BadInput(f"{d.path}: tensor {dup!r} is listed both with and without a rank")
    return Dump(d.path, d.model, d.producer, d.run, tuple(entries), world)


def _open_one(root: Path) -> tuple[Dump, list]:
    """One manifest's dump, and per entry its rank tag (`shard.Tagged` without data) or None."""
    if root.is_file():
        if root.suffix.lower() in PICKLE_EXT:
            raise BadInput(f"{root} is a {root.suffix} file, which may hold a pickle; tensordiff never unpickles. "
                           "A dump is a directory with manifest.json and safetensors/HDF5 files")
        raise BadInput(f"{root} is a file; a dump is a directory with manifest.json")
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise BadInput(f"{mpath} is a directory; a dump's manifest.json is a file" if mpath.is_dir()
                       else f"{root} has no manifest.json (not a tensordiff dump)")
    try:  # a symlink out of the dump is confined like the tensor files
        mpath.resolve().relative_to(root.resolve())
    except ValueError:
        raise BadInput(f"{mpath} is a link to {mpath.resolve()}, outside the dump directory; "
                       "copy the manifest into the dump instead") from None
    if mpath.stat().st_size > MAX_MANIFEST:
        raise BadInput(f"{mpath} is implausibly large ({mpath.stat().st_size} bytes)")
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise BadInput(f"{mpath} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    except OSError as e:  # unreadable to this user
        raise BadInput(f"cannot read {mpath}: {e.strerror}") from None
    if not isinstance(m, dict):
        raise BadInput(f"{mpath}: expected a JSON object")
    if m.get("format") != FORMAT:
        raise BadInput(f"{mpath}: format is {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("version") != 1:
        raise BadInput(f"{mpath}: format version {m.get('version')!r} is not supported (this reader knows version 1)")
    model = m.get("model")
    if not isinstance(model, str) or not model or not model.isprintable():
        raise BadInput(f"{mpath}: 'model' must be a non-empty, one-line string")
    tensors = m.get("tensors")
    if not isinstance(tensors, list):
        raise BadInput(f"{mpath}: 'tensors' must be a list")
    headers: dict[Path, dict[str, StoredTensor]] = {}
    files: dict[str, Path] = {}  # each file named once is resolved (and checked) once
    root_resolved = root.resolve()
    entries: list[Entry] = []
    tags: list = []
    seen: set[tuple] = set()
    prank, pworld = shard.parallel_of(str(mpath), m.get("run") if isinstance(m.get("run"), dict) else {})
    with contextlib.ExitStack() as h5:
        h5files: dict[Path, object] = {}  # each HDF5 file opened once, closed at the end
        layouts: dict[Path, object] = {}  # and its own metadata read once (`hdf5_layout`)
        for i, t in enumerate(tensors):
            entry, rank = _entry(mpath, root, root_resolved, i, t, seen, prank, files, headers, (layouts, h5files), h5)
            entries.append(entry)
            tagged = shard.is_annotated(t) or prank is not None
            lay = (shard.parse_layout(f"{mpath}: tensor {entry.name!r}", t, len(entry.stored.shape), rank, pworld)
                   if tagged else None)
            tags.append(shard.Tagged(entry.name, entry.boundary, rank, lay, entry.stored, entry.sha256)
                        if tagged else None)
    producer = m.get("producer") if isinstance(m.get("producer"), dict) else {}
    run = m.get("run") if isinstance(m.get("run"), dict) else {}
    return Dump(root, model, producer, run, tuple(entries)), tags


def _entry(mpath: Path, root: Path, root_resolved: Path, i: int, t, seen: set[tuple], prank: int | None,
           files: dict[str, Path], headers: dict[Path, dict[str, StoredTensor]], hdf5: tuple[dict, dict],
           h5: contextlib.ExitStack) -> tuple[Entry, int | None]:
    """One manifest entry, validated, as an Entry, with the rank it belongs to (None: unsharded)."""
    if not isinstance(t, dict):
        raise BadInput(f"{mpath}: tensors[{i}] is not an object")
    name = t.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise BadInput(f"{mpath}: tensors[{i}] has an invalid name {name!r}")
    rank = t.get("rank", prank)
    if "rank" in t and (type(rank) is not int or rank < 0):
        raise BadInput(f"{mpath}: tensor {name!r} has rank {t.get('rank')!r}; a rank is an integer >= 0")
    if (name, t.get("rank")) in seen:  # a name may appear twice only with different ranks
        raise BadInput(f"{mpath}: tensor {name!r} is listed twice" + (f" for rank {rank}" if "rank" in t else ""))
    seen.add((name, t.get("rank")))
    boundary = t.get("boundary") or default_boundary(name)
    if not isinstance(boundary, str) or not NAME_RE.match(boundary):
        raise BadInput(f"{mpath}: tensor {name!r} has an invalid boundary {boundary!r}")
    rel = t.get("file")
    if "file" not in t or rel is None:
        raise BadInput(f"{mpath}: tensor {name!r} has no 'file' (the name of the tensor file inside the dump "
                       "that holds it, e.g. \"patches.safetensors\")")
    fpath = files.get(rel) if isinstance(rel, str) else None
    if fpath is None:
        fpath = _inside(root, rel, "file", root_resolved)
        file_kind(fpath)
        if fpath.is_dir():
            raise BadInput(f"{mpath}: tensor {name!r} names file {rel!r}, which is a directory, not a tensor file")
        if not fpath.is_file():
            raise BadInput(f"{mpath}: tensor {name!r} names file {t.get('file')!r}, which is missing")
        files[rel] = fpath
    kind = file_kind(fpath)
    key = t.get("key", name)
    if not isinstance(key, str) or not key or "\0" in key:
        raise BadInput(f"{mpath}: tensor {name!r} has an invalid key")
    if kind == "safetensors":
        if fpath not in headers:
            headers[fpath], _ = read_safetensors_header(fpath)
        if key not in headers[fpath]:
            raise BadInput(f"{fpath}: has no tensor {key!r} (named by {name!r} in the manifest)")
        st = headers[fpath][key]
    else:
        st = _hdf5(fpath, key, t.get("dtype"), *hdf5, h5)
    want_shape, want_dtype = t.get("shape"), t.get("dtype")
    if want_dtype is not None and (not isinstance(want_dtype, str) or want_dtype not in BY_NAME):
        raise BadInput(f"{mpath}: tensor {name!r} has unknown dtype {want_dtype!r}")
    if want_dtype is not None and want_dtype != st.dtype.name:
        raise BadInput(f"{mpath}: tensor {name!r} is {st.dtype.name} in its file but {want_dtype} in the manifest")
    if want_shape is not None and (not isinstance(want_shape, list)
                                   or not all(type(x) is int and x >= 0 for x in want_shape)):
        raise BadInput(f"{mpath}: tensor {name!r} has shape {want_shape!r}; a shape is a list of "
                       "non-negative integers, e.g. [3774, 32]")
    if want_shape is not None and list(want_shape) != list(st.shape):
        raise BadInput(f"{mpath}: tensor {name!r} has shape {list(st.shape)} in its file but {want_shape} in the manifest")
    sha = t.get("sha256")
    if sha is not None and not (isinstance(sha, str) and SHA256_RE.match(sha)):
        # a digest that cannot be checked is refused, never skipped: `--verify` would pass it unread
        raise BadInput(f"{mpath}: tensor {name!r} has sha256 {str(sha)[:80]!r} ({type(sha).__name__}); a sha256 is "
                       "64 hex digits in a string, or absent")
    return Entry(name, boundary, st, sha.lower() if sha is not None else None), rank


def _hdf5(fpath: Path, key: str, dtype_name, layouts: dict, h5files: dict, stack: contextlib.ExitStack) -> StoredTensor:
    """One HDF5 dataset: located from the file's own metadata when it is a plain one (no h5py
    call: ~5 us a dataset), else through h5py (the file opened once), which also names any fault."""
    if fpath not in layouts:
        layouts[fpath] = stack.enter_context(contextlib.closing(Layout(fpath)))
    st = plain_hdf5_entry(layouts[fpath], key, dtype_name)
    if st is not None:
        return st
    if fpath not in h5files:
        h5files[fpath] = _open_hdf5(fpath, stack)
    return read_hdf5_entry(fpath, key, dtype_name, h5files[fpath])


def _open_hdf5(path: Path, stack: contextlib.ExitStack):
    import h5py


    try:
        return stack.enter_context(h5py.File(path, "r"))
    except H5_ERRORS as e:
        raise BadInput(f"{path}: not a readable HDF5 file ({type(e).__name__}: {str(e)[:200]})") from None
