"""What every importer shares: turning another tool's tensor names into dump names, and writing
the imported tensors as one tensordiff dump (through `Recorder`: copied, atomic, never over an
existing path unless --force replaces a dump).

Imported tensors keep the other tool's order; their boundaries are the importer's (a module's
call, or each tensor its own), a chain in that order unless a contract file says otherwise
(`compare --contract`). A name changed to fit the dump
format is recorded in `run.import.renamed` (new -> original), so nothing is lost.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensordiff.format.capture import NAME_RE, Recorder
from tensordiff.errors import BadInput

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

    def add(self, original: str, array: Any, boundary: str | None = None) -> None:
        name = dump_name(original)
        for orig, n, *_ in self.tensors:
            if n == name:
                raise BadInput(f"{self.source}: tensors {orig!r} and {original!r} both become {name!r} in a dump; "
                               "rename one in the producing tool")
        self.tensors.append((original, name, array, dump_name(boundary) if boundary else name))


def write(imp: Imported, out: Path, *, model: str, overwrite: bool = False) -> Path:
    if not imp.tensors:
        raise BadInput(f"{imp.source}: no tensors to import (an empty dump would compare nothing)")
    renamed = {n: o for o, n, *_ in imp.tensors if n != o}
    run = {"import": {"tool": imp.tool, "source": str(imp.source), **imp.facts,
                      **({"renamed": renamed} if renamed else {}), **({"notes": imp.notes} if imp.notes else {})}}
    producer = {"name": imp.tool, "imported_by": "tensordiff import"}
    with Recorder(out, model=model, producer=producer, run=run, overwrite=overwrite) as rec:
        for _, name, arr, boundary in imp.tensors:
            rec.record(name, arr, boundary=boundary)
    return out


def bf16_from_bits(bits: np.ndarray):
    """A bfloat16 array read as raw uint16 bits, as a torch tensor (numpy has no bfloat16)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
