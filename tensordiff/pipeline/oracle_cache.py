"""The oracle cache: oracle dumps kept under `cache_root()/oracle/<key>`, because the oracle is
the expensive side and, for given inputs, never changes.

The key is everything that determines the dump: the model, the code the oracle runs (the
adapter's declared `sources`), the library versions, the CONTENT of the weights
(`provenance.run_weights`), the image bytes, dtype, device, prompt, decode steps and
options. An adapter that declares no sources gets no cache: an edit to its oracle could not be
seen.

Reuse is verified: every tensor's sha256 is checked against its manifest before a cached dump is
used; one that fails is a miss (set aside, recomputed) and the lookup says why. Entries are
written under a unique staging name and renamed into place, so two processes sharing one cache
never see half a dump; when both compute the same key, the first rename wins and the second
process uses that one.

A process hashes an entry once: a verified entry's files are remembered by their stat key
(`provenance.stat_key`: device, inode, size, mtime, ctime, the one key every cache here uses),
and a later lookup in the same process whose files all stat the same is verified already (a gate
or a test run reads one entry for many cases). Any write to a file moves its ctime, which no one
can set back; files changed less than `provenance.RACY_NS` before their verification began are
hashed again every time (`provenance.settled`, git's "racily clean" rule: a write in the same
clock tick as the stat would keep every field).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensordiff.errors import BadInput
from tensordiff.cache import cache_root
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.provenance import image_digest, run_weights, settled, source_digest, stat_key, versions


@dataclass(frozen=True)
class Lookup:
    path: Path | None  # the verified cached dump, or None
    status: str  # "hit" | "miss" | "rejected" | "off"
    note: str = ""  # why (for "rejected" and "off"), for the report and the status line


def root() -> Path:
    d = cache_root() / "oracle"
    d.mkdir(parents=True, exist_ok=True)
    return d


def key(adapter, req) -> str | None:
    """The cache key of the oracle's dump for `req`, or None when the adapter declares no sources."""
    if not adapter.sources:
        return None
    img = image_digest(req.image) if req.image else "none"
    parts = {"model": adapter.name, "src": source_digest(adapter.sources), "versions": versions(),
             "weights": run_weights(adapter, req), "image": img, "dtype": req.dtype,
             "device": req.device, "prompt": req.prompt, "decode": req.decode,
             "options": adapter.options.for_side(req.options, "oracle", undeclared=True)}
    if req.more_images:  # absent for one image, so single-image keys stay what they were
        parts["more_images"] = [image_digest(p) for p in req.more_images]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


# entry path -> the stat signature of its files when this process last verified it (see above)
_VERIFIED: dict[str, tuple] = {}


def _signature(path: Path) -> tuple | None:
    """(name, stat key) of every file of the entry, sorted; None when it holds anything but
    plain files (never remembered)."""
    out = []
    try:
        with os.scandir(path) as it:
            for f in it:
                if not f.is_file(follow_symlinks=False):
                    return None
                out.append((f.name, stat_key(f.stat(follow_symlinks=False))))
    except OSError:
        return None
    return tuple(sorted(out))


def verified(path: Path) -> str | None:
    """`verify(path)`, but an entry this process verified whose files are unchanged since (their
    stat signature) is not hashed again."""
    sig = _signature(path)
    if sig is not None and _VERIFIED.get(str(path)) == sig:
        return None
    began = time.time_ns()
    why = verify(path)
    _VERIFIED.pop(str(path), None)
    if why is None and sig is not None and _signature(path) == sig and all(settled(k, began) for _, k in sig):
        _VERIFIED[str(path)] = sig
    return why


def verify(path: Path) -> str | None:
    """None when every tensor of the dump at `path` matches its manifest sha256, else why not."""
    try:
        d = open_dump(path)
    except BadInput as e:
        return f"unreadable ({e})"
    for e in d.entries:
        if e.sha256 is None:
            return f"tensor {e.name!r} has no sha256 in the manifest"
        try:
            if e.computed_sha256() != e.sha256:
                return f"tensor {e.name!r} fails its sha256"
        except (OSError, BadInput) as err:
            return f"tensor {e.name!r} cannot be read ({err})"
    return None


def _discard(path: Path) -> None:
    """Move a bad entry aside atomically (a unique name), then delete it."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.rejected-", dir=path.parent))
    try:
        os.rename(path, aside / "dump")
    except OSError:  # another process moved it first
        pass
    shutil.rmtree(aside, ignore_errors=True)


def lookup(k: str | None) -> Lookup:
    if k is None:
        return Lookup(None, "off", "the adapter declares no oracle sources (ModelAdapter.sources)")
    path = root() / k
    if not (path / "manifest.json").is_file():
        return Lookup(None, "miss")
    why = verified(path)
    if why is None:
        return Lookup(path, "hit")
    _discard(path)
    return Lookup(None, "rejected", f"the cached oracle dump {path} failed verification ({why}); it was "
                                    "discarded and the oracle run again")


def store(k: str, produce: Callable[[Path], Path]) -> Path:
    """`produce(target)` writes a dump at `target` (which must not exist yet); the result is
    renamed to the entry for `k`. Returns the entry (ours, or another process's that won)."""
    base = root()
    staging = Path(tempfile.mkdtemp(prefix=f".{k}.staging-", dir=base))  # unique per writer
    try:
        produced = produce(staging / "dump")
        final = base / k
        try:
            os.rename(produced, final)
        except OSError:  # another process stored this key first; theirs is verified on lookup
            if not (final / "manifest.json").is_file():
                raise
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)
