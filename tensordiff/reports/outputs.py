"""Where a report may be written: never over an input, never over a file that is not ours.

Every report option (`--json`, `--html`, `--junit`, calibration `--out`) is checked before any
work runs, with the command's inputs: dump directories, images, checkpoints, tolerance and gate
files. A report path is refused (BadInput, exit 2) when it
- is, or lies inside, an input (a dump directory, a checkpoint directory, an image file, ...);
- is a directory, or its directory is missing or not writable;
- is an existing file that is not a tensordiff report of that kind (replacing a report of ours,
  or an empty file, loses nothing).
Two report options naming the same file are refused too (the second would replace the first).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from tensordiff.errors import BadInput

SNIFF = 1 << 16  # how much of an existing file is read to recognise it


def _is_ours(p: Path, kind: str) -> bool:
    """Whether the existing file `p` is a report this toolkit wrote (of `kind`)."""
    try:
        if p.stat().st_size == 0:
            return True
        with open(p, "rb") as f:
            head = f.read(SNIFF)
    except OSError:
        return False
    text = head.decode("utf-8", "replace")
    if kind == "json":
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        return isinstance(d, dict) and ({"verdict", "earliest", "boundaries"} <= d.keys() or {"gate", "cases"} <= d.keys())
    if kind == "html":
        return text.startswith("<!DOCTYPE html>") and "<p class=dim>tensordiff " in text
    if kind == "junit":
        return text.startswith('<?xml version="1.0" encoding="UTF-8"?>') and "<testsuites" in text[:400]
    if kind == "calibration":
        return text.startswith("# Noise floors measured by `tensordiff calibrate`")
    raise ValueError(kind)


def _inside(p: Path, q: Path) -> bool:
    return p == q or q in p.parents


def guard(path: str | os.PathLike | None, option: str, kind: str, inputs: Iterable = ()) -> None:
    """Refuse `path` as the target of report option `option` (e.g. "--json") of `kind` (json,
    html, junit, calibration) unless writing it loses nothing; `inputs` are the command's input
    paths (None entries are skipped)."""
    if path is None:
        return
    p = Path(path)
    rp = p.resolve()
    for inp in inputs:
        if inp is None:
            continue
        ri = Path(inp).resolve()
        if _inside(rp, ri):
            what = "is" if rp == ri else "is inside"
            raise BadInput(f"cannot write {option} {p}: it {what} the input {inp}; write the report somewhere else")
    if rp.is_dir():
        raise BadInput(f"cannot write {option} {p}: it is a directory; give a file name")
    parent = rp.parent
    if not parent.is_dir():
        raise BadInput(f"cannot write {option} {p}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise BadInput(f"cannot write {option} {p}: directory {parent} is not writable")
    if rp.exists() or p.is_symlink():
        if p.is_symlink() or not rp.is_file() or not _is_ours(rp, kind):
            raise BadInput(f"cannot write {option} {p}: it exists and is not a tensordiff {kind} report; "
                           "refusing to overwrite it (remove it or pick another name)")


def guard_all(options: Iterable[tuple], inputs: Iterable = ()) -> None:
    """`guard` each (path, option, kind), and refuse two options naming one file."""
    inputs = list(inputs)
    seen: dict[Path, str] = {}
    for path, option, kind in options:
        if path is None:
            continue
        guard(path, option, kind, inputs)
        rp = Path(path).resolve()
        if rp in seen:
            raise BadInput(f"{option} and {seen[rp]} both name {path}; give each report its own file")
        seen[rp] = option


def guard_reports(json_path, junit_path, html_path, inputs: Iterable = ()) -> None:
    """The three report options of compare / check / gate."""
    guard_all([(json_path, "--json", "json"), (junit_path, "--junit", "junit"), (html_path, "--html", "html")], inputs)


def gate_inputs(cfg) -> list:
    """A gate config's input files: every model's images, checkpoint directory and tolerance file."""
    out = []
    for m in cfg.models:
        out += [p for i in m.images for p in (i if isinstance(i, tuple) else (i,))]  # several-image cases flattened
        if m.weights and not str(m.weights).startswith("synthetic:"):
            out.append(m.weights)
        out.append(m.tolerances)
    return out


def dump_root(out: str | os.PathLike, option: str = "--out") -> Path:
    """The directory that will hold a run's dumps (`check --out`): created if missing, refused
    when it is a file, not empty, or not writable."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise BadInput(f"{option} {p} is a file; give a directory (it will hold oracle/ and engine/)")
    if p.is_dir() and any(p.iterdir()):
        raise BadInput(f"{option} {p} exists and is not empty; refusing to overwrite dumps there")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{option} {p}: cannot create it ({e.strerror}); pick a writable directory") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {p} is not writable; pick a writable directory")
    return p
