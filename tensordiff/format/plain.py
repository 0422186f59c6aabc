"""Plain safetensors files as dumps: compare tensors written by any tool, with no manifest.

    tensordiff compare ref.safetensors mine.safetensors
    tensordiff compare ref/ mine/          # folders of .safetensors files, no manifest.json

Keys are tensor names, and each tensor is its own boundary (its key; a contract file
(`--contract`, `tensordiff.judge.contract_file`) groups and renames them). The order is the files'
order: the files of a folder by name, numbers compared as numbers (`part2` before `part10`), and
inside a file the order of its header, which is the order of the data. Note that the
`safetensors` Python writer sorts a file's tensors by dtype and then by name, not in the order
they were given, so name the order with a contract (or write one file per boundary) where it
matters. The producer is recorded as "plain safetensors".

Compared with a dump of a named model (an oracle's), a plain file takes that model and its
contract: its tensors then group into boundaries by the model's rule (`rope.cos` -> `rope`),
so an engine that writes the oracle's tensor names needs no manifest at all.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from tensordiff.format.capture import NAME_RE, default_boundary
from tensordiff.format.dump import Dump, Entry, open_dump
from tensordiff.errors import BadInput
from tensordiff.format.storage import SAFETENSORS_EXT, read_safetensors_header

PRODUCER = "plain safetensors"
MODEL = "plain"  # the model of a dump that names none; a contract file may name it


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def plain_files(path: Path) -> list[Path] | None:
    """The safetensors files `path` stands for when it is no manifest dump, else None."""
    if path.is_file() and path.suffix.lower() in SAFETENSORS_EXT:
        return [path]
    if path.is_dir() and not (path / "manifest.json").exists():
        files = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SAFETENSORS_EXT]
        return sorted(files, key=lambda p: _natural(p.name)) or None
    return None


def open_plain(files: list[Path], root: Path | None = None) -> Dump:
    entries: list[Entry] = []
    where: dict[str, Path] = {}
    for f in files:
        header, _ = read_safetensors_header(f)
        for key, st in sorted(header.items(), key=lambda kv: kv[1].offset):
            if not NAME_RE.match(key) or ".." in key:
                raise BadInput(f"{f}: tensor key {key!r} is not usable as a name (letters, digits, '_', '-', "
                               "single '.'); rename it, or import the file with `tensordiff import`")
            if key in where:
                raise BadInput(f"{f}: tensor {key!r} is also in {where[key]}; a name must be unique in a dump")
            where[key] = f
            entries.append(Entry(key, key, st, None))
    base = root or (files[0] if len(files) == 1 else files[0].parent)
    producer = {"name": PRODUCER, "files": [str(f) for f in files]}
    return Dump(base, MODEL, producer, {}, tuple(entries))


def open_any(path: str | Path) -> Dump:
    """A tensordiff dump (a directory with manifest.json), or plain safetensors (a file, or a
    folder of them without a manifest)."""
    p = Path(path)
    files = plain_files(p)
    if files is None:
        return open_dump(p)
    return open_plain(files, p)


def adopt(da: Dump, db: Dump) -> tuple[Dump, Dump]:
    """A plain side of a pair takes the other side's model, its boundaries by the first-dot rule."""
    if da.model == db.model or MODEL not in (da.model, db.model):
        return da, db
    plain, named = (da, db) if da.model == MODEL else (db, da)
    entries = tuple(replace(e, boundary=default_boundary(e.name)) for e in plain.entries)
    plain = replace(plain, model=named.model, entries=entries)
    return (plain, named) if da.model == MODEL else (named, plain)
