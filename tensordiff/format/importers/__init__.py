"""What every importer shares: turning another tool's tensor names into dump names, and writing
the imported tensors as one tensordiff dump (through `Recorder`: copied, atomic, never over an
existing path unless --force replaces a dump).

Imported tensors keep the other tool's order; their boundaries are the importer's (a module's
call, or each tensor its own), a chain in that order unless a contract file says otherwise
(`compare --contract`). A name changed to fit the dump
format is recorded in `run.import.renamed` (new -> original), so nothing is lost.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensordiff.errors import BadInput
from tensordiff.format.capture import NAME_RE, Recorder, current_umask, is_dump_dir
from tensordiff.format.shard import RANK_DIR
from tensordiff.format.storage import fsync_dir

_BAD = re.compile(r"[^A-Za-z0-9_.\-]+")


def dump_name(original: str) -> str:
    """A dump name for a foreign tensor name: path separators and other characters become '.'
    or '_', empty parts vanish ("/proj/MatMul_output_0" -> "proj.MatMul_output_0")."""
    s = original.replace("/", ".").replace("\\", ".").replace(":", "_")
    s = _BAD.sub("_", s)
    s = ".".join(p for p in s.split(".") if p)
    return s if NAME_RE.match(s or "-") and s else "_"


@dataclass
class Imported:
    """Tensors read from another tool, in its order, with the facts of where they came from."""

    tool: str
    source: Path
    tensors: list[tuple[str, str, Any, str]] = field(default_factory=list)  # (original, dump name, array, boundary)
    notes: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    layouts: dict[str, dict] = field(default_factory=dict)  # dump name -> its rank layout (a rank's import)
    _names: dict[str, str] = field(default_factory=dict, repr=False)  # dump name -> original

    def add(self, original: str, array: Any, boundary: str | None = None, *, name: str | None = None,
            layout: dict | None = None) -> None:
        """`name`: the dump name when the importer builds it itself (else `dump_name(original)`);
        `layout`: how this rank's tensor makes up the whole (`Recorder.record(layout=)`)."""
        name = dump_name(name if name is not None else original)
        if name in self._names:
            raise BadInput(f"{self.source}: tensors {self._names[name]!r} and {original!r} both become {name!r} "
                           "in a dump; rename one in the producing tool")
        self._names[name] = original
        self.tensors.append((original, name, array, dump_name(boundary) if boundary else name))
        if layout is not None:
            self.layouts[name] = layout


def _run(imp: Imported) -> dict:
    renamed = {n: o for o, n, *_ in imp.tensors if n != o}
    return {"import": {"tool": imp.tool, "source": str(imp.source), **imp.facts,
                       **({"renamed": renamed} if renamed else {}), **({"notes": imp.notes} if imp.notes else {})}}


def _record(imp: Imported, path: Path, model: str, run: dict, overwrite: bool) -> None:
    producer = {"name": imp.tool, "imported_by": "tensordiff import"}
    with Recorder(path, model=model, producer=producer, run=run, overwrite=overwrite) as rec:
        for _, name, arr, boundary in imp.tensors:
            rec.record(name, arr, boundary=boundary, layout=imp.layouts.get(name))


def write(imp: Imported, out: Path, *, model: str, overwrite: bool = False) -> Path:
    if not imp.tensors:
        raise BadInput(f"{imp.source}: no tensors to import (an empty dump would compare nothing)")
    _record(imp, out, model, _run(imp), overwrite)
    return out


def is_rank_set(path: Path) -> bool:
    """A real directory holding rank dumps (`rank0`, `rank1`, ...) and nothing else: what
    `write_ranks` writes, and the only other thing `--force` replaces."""
    if path.is_symlink() or not path.is_dir():
        return False
    kids = list(path.iterdir())
    return bool(kids) and all(RANK_DIR.match(k.name) and is_dump_dir(k) for k in kids)


def write_ranks(ranks: list[Imported], out: Path, *, model: str, overwrite: bool = False) -> Path:
    """One dump per rank (`out/rank0` ... `out/rank{W-1}`, `run.parallel` = {rank, world}), the
    set written under a temporary name beside `out` and renamed into place whole: a crash never
    leaves some ranks written. An existing `out` is replaced only with `overwrite` and only when it
    is a tensordiff dump or such a set of rank dumps."""
    if not any(imp.tensors for imp in ranks):
        raise BadInput(f"{ranks[0].source}: no tensors to import (an empty dump would compare nothing)")
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise BadInput(f"{out} already exists; refusing to overwrite it (pass --force to replace a dump)")
        if not (is_dump_dir(out) or is_rank_set(out)):
            raise BadInput(f"{out} is not a tensordiff dump or a set of rank dumps; --force only replaces those, "
                           "so pick another --out or remove it yourself")
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"cannot create {parent}: {e.strerror}") from None
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        world = len(ranks)
        for r, imp in enumerate(ranks):
            run = _run(imp)
            run["parallel"] = {"rank": r, "world": world}
            _record(imp, tmp / f"rank{r}", model, run, False)
        os.chmod(tmp, 0o777 & ~current_umask())
        if out.exists() or out.is_symlink():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def bf16_from_bits(bits: np.ndarray):
    """A bfloat16 array read as raw uint16 bits, as a torch tensor (numpy has no bfloat16)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
