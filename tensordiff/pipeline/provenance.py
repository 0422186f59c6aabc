"""Provenance: what a dump was made from, written once per side by the core (`runs.run_side`),
never by a runner. A runner adds model facts only (its grid, its prompt tokens, the attention
kernel it used) through `Recorder.update_run`, which merges them in deeply.

- `run_weights(adapter, req)` / `weights_fingerprint(dir, prefixes)`: the content identity of
  the weights a run reads: sha256 over the name and the sha256 of the BYTES of every file it
  reads (the JSON files, and the safetensors shards holding the tensor-name prefixes the
  adapter declares for the run, or all shards). A file's sha256 is cached in the cache dir by
  its `stat_key` (device, inode, size, mtime, ctime), so a second run costs a stat per file. Any
  write moves a file's ctime, which no tool can set back (`cp -p`, `rsync -t`, `os.utime` restore
  the mtime only), so a file rewritten in place is hashed again; a file changed within
  `RACY_NS` of the hash is not remembered (`settled`). Every cache of this package that keys a
  file by its stat takes the key from `stat_key` (the oracle cache's entries too).
- `versions()`: the library versions a dump depends on.
- `describe_image(path)`: the input image (sha256, size, mode, format, and the file facts
  `inputs.file_facts`: frames, the frame used, the EXIF orientation tag).
- `source_digest(sources)`: the code a model's oracle runs, from the files and packages its
  adapter declares (`ModelAdapter.sources`), found WITHOUT importing them.

The oracle cache key (`oracle_cache.key`) is built from these, so the cache and the manifest
carry the same fingerprint.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tensordiff.errors import BadInput
from tensordiff.cache import cache_root
from tensordiff.format.checkpoint import INDEX, weight_map
from tensordiff.pipeline.inputs import check_image

PACKAGES = ("torch", "transformers", "pillow", "numpy", "safetensors", "torchvision", "tensordiff")
WEIGHT_SUFFIXES = (".json", ".safetensors")
BLOCK = 1 << 22
# The core's own code that shapes a dump whatever the model: how tensors are recorded and stored.
CORE_SOURCES = ("tensordiff.format.capture", "tensordiff.format.storage", "tensordiff.format.dtypes")


_VERSIONS: dict = {}  # read once per process: a package's metadata is a directory scan per name


def versions() -> dict:
    import importlib.metadata as md

    if not _VERSIONS:
        _VERSIONS["python"] = sys.version.split()[0]
        for pkg in PACKAGES:
            try:
                _VERSIONS[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                pass
    return dict(_VERSIONS)


def image_digest(path: str | Path) -> str:
    """The sha256 of an input image's bytes: the one digest the dump and the oracle cache key share."""
    return check_image(path)["sha256"]


def describe_image(path: str | Path | None) -> dict | None:
    if path is None:
        return None
    d = check_image(path)
    return {"sha256": d["sha256"], "bytes": Path(path).stat().st_size, "size": [d["width"], d["height"]],
            "width": d["width"], "height": d["height"], "mode": d["mode"], "format": d["format"],
            **{k: d[k] for k in ("frames", "frame_used", "exif_orientation")}}


# ----------------------------------------------------------------------------- file identity

def _hash_cache_dir() -> Path:
    d = cache_root() / "filehash"
    d.mkdir(parents=True, exist_ok=True)
    return d


# A file whose last change lies within this of the moment it was read is not remembered by its
# stat: a write in the same clock tick as that change would keep every field (git's "racily
# clean" rule).
RACY_NS = 2_000_000_000


def stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """The one key by which every cache here remembers a file: (device, inode, size, mtime_ns,
    ctime_ns). The ctime is what makes it safe: any write moves it, and nothing sets it back."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(key: tuple[int, ...], began_ns: int) -> bool:
    """Whether a file of stat key `key`, read from `began_ns` (time.time_ns) on, may be
    remembered by that key: its last change (mtime or ctime) is more than RACY_NS older."""
    return began_ns - max(key[3], key[4]) > RACY_NS


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, remembered by its `stat_key`: a second call is a stat."""
    p = Path(path).resolve()
    began = time.time_ns()
    st = p.stat()
    stamp = list(stat_key(st))
    memo = _hash_cache_dir() / (hashlib.sha256(str(p).encode()).hexdigest()[:32] + ".json")
    try:
        rec = json.loads(memo.read_text())
        if rec.get("stamp") == stamp and isinstance(rec.get("sha256"), str):
            return rec["sha256"]
    except (OSError, ValueError):
        pass
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    digest = h.hexdigest()
    # not rewritten while we read it, and not changed so recently that a later write could keep
    # every field of the key: worth remembering
    if list(stat_key(p.stat())) == stamp and settled(stamp, began):
        fd, tmp = tempfile.mkstemp(prefix=f".{memo.name}.", dir=memo.parent)  # unique per writer
        with os.fdopen(fd, "w") as f:
            json.dump({"path": str(p), "stamp": stamp, "sha256": digest}, f)
        os.replace(tmp, memo)  # atomic: a concurrent reader sees the old record or this one
    return digest


def weight_files(wdir: Path, prefixes: tuple[str, ...] | None = None) -> list[Path]:
    """The checkpoint files a run reads: every JSON file, and the safetensors shards that hold a
    tensor whose name starts with one of `prefixes` (all shards when `prefixes` is None, or when
    there is no readable index to say which shard holds what)."""
    wdir = Path(wdir)
    files = sorted(p for p in wdir.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if prefixes is None:
        return files
    try:
        wm = weight_map(wdir) if (wdir / INDEX).is_file() else None
    except BadInput:
        wm = None
    if wm is None:
        return files  # no index (a lone model.safetensors) or a broken one the runner will refuse
    needed = {shard for name, shard in wm.items() if name.startswith(tuple(prefixes))}
    return [p for p in files if p.suffix == ".json" or p.name in needed]


def weights_fingerprint(wdir: str | Path | None, prefixes: tuple[str, ...] | None = None) -> str:
    """"sha256:<hex>" over (name, sha256 of bytes) of every checkpoint file a run reads
    (`weight_files`); "none" without a checkpoint."""
    if wdir is None:
        return "none"
    wdir = Path(wdir)
    if not wdir.is_dir():
        raise BadInput(f"weights directory {wdir} does not exist")
    h = hashlib.sha256()
    for p in weight_files(wdir, prefixes):
        h.update(f"{p.name}\0{file_sha256(p)}\n".encode())
    return "sha256:" + h.hexdigest()


def run_weights(adapter, req) -> str:
    """The weights fingerprint of one run: the files the adapter says the run reads
    (`ModelAdapter.weight_prefixes`), else the whole checkpoint. The manifest and the oracle
    cache key both take it from here."""
    prefixes = adapter.weight_prefixes(req) if adapter.weight_prefixes is not None else None
    return weights_fingerprint(req.weights_dir, tuple(prefixes) if prefixes is not None else None)


# ----------------------------------------------------------------------------- source identity

def source_files(name: str) -> list[tuple[str, Path]]:
    """(path under the source, file) for the .py files of a module or package named `name`
    (dotted), or of a file or folder path; found through the import system's finders from the
    top-level package down, never importing anything."""
    p = Path(name)
    if p.is_absolute() or os.sep in name:
        base = p
    else:
        top, *rest = name.split(".")
        spec = importlib.util.find_spec(top)
        if spec is None:
            raise BadInput(f"adapter source {name!r}: no module {top!r} is importable")
        roots = list(spec.submodule_search_locations or [])
        if not roots:  # a top-level module
            if rest or not spec.origin:
                raise BadInput(f"adapter source {name!r}: {top!r} is a module, not a package")
            return [(Path(spec.origin).name, Path(spec.origin))]
        base = next((Path(r).joinpath(*rest) for r in roots if Path(r).joinpath(*rest).is_dir()
                     or Path(r).joinpath(*rest).with_suffix(".py").is_file()), Path(roots[0]).joinpath(*rest))
        if not base.is_dir():
            base = base.with_suffix(".py")
    if base.is_dir():
        return [(str(f.relative_to(base)), f) for f in sorted(base.rglob("*.py")) if "__pycache__" not in f.parts]
    if base.is_file():
        return [(base.name, base)]
    raise BadInput(f"adapter source {name!r} is neither a package, a module nor a file ({base})")


def source_digest(sources) -> str:
    """sha256 over every declared source file (its path under its root, its bytes), plus the
    core's recording code."""
    h = hashlib.sha256()
    for name in (*CORE_SOURCES, *sources):
        for rel, f in source_files(name):
            h.update(f"{name}:{rel}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()
