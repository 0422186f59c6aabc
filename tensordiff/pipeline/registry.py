"""Finds model adapters through the `tensordiff.models` entry-point group.

This is the only place in `tensordiff` that reaches model code, and it does so lazily: the
core (format, compare, report) works with no model installed.
"""
from __future__ import annotations

import sys

from tensordiff.errors import BadInput
from tensordiff.judge.contract import Contract
from tensordiff.pipeline.adapter import ModelAdapter

GROUP = "tensordiff.models"


_FOUND: dict[tuple[str, ...], dict] = {}  # sys.path -> the group's entry points (a scan of every dist-info)


def _eps():
    from importlib.metadata import entry_points

    path = tuple(sys.path)  # an entry point appears with its distribution's folder on sys.path
    if path not in _FOUND:
        _FOUND.clear()
        _FOUND[path] = {ep.name: ep for ep in entry_points(group=GROUP)}
    return dict(_FOUND[path])


def names() -> list[str]:
    return sorted(_eps())


def adapter(name: str) -> ModelAdapter:
    eps = _eps()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none installed"
        raise BadInput(f"unknown model {name!r} (known: {known})")
    ep = eps[name]
    dist = getattr(getattr(ep, "dist", None), "name", None) or "tensordiff"
    try:
        obj = ep.load()
    except ImportError as e:
        raise BadInput(f"the adapter for {name!r} could not be loaded ({e}); reinstall {dist}") from None
    obj = obj() if callable(obj) and not isinstance(obj, ModelAdapter) else obj
    # a third-party package's entry point is input like any other: refused in one line when wrong
    if not isinstance(obj, ModelAdapter):
        raise BadInput(f"entry point {name!r} of {dist} ({ep.value}) gives a {type(obj).__name__}, "
                       "not a tensordiff.pipeline.adapter.ModelAdapter")
    if obj.name != name:
        raise BadInput(f"entry point {name!r} of {dist} gives the adapter of {obj.name!r}; the two names must agree")
    return obj


def _may_declare(name: str) -> bool:
    """False only when no distribution on sys.path can declare `name` in GROUP: each
    .dist-info/.egg-info directory's entry_points.txt is read as bytes, which is what
    importlib.metadata reads, without importing it (~20 ms) or parsing every file (~20 ms more).
    Only a negative answer is trusted: a file naming GROUP and `name` anywhere, a path entry this
    scan cannot read (a zip) or a finder other than the path finder that can list distributions
    means "maybe", and importlib.metadata decides."""
    import os
    import sys
    from importlib.machinery import PathFinder

    if any(getattr(f, "find_distributions", None) is not None and f is not PathFinder for f in sys.meta_path):
        return True
    group, key = GROUP.encode(), name.encode()
    for entry in sys.path:
        where = entry or "."  # "" is the working directory, as the path finder reads it
        try:
            children = os.scandir(where)
        except OSError:  # not a directory: a zip on the path may hold distributions; else nothing
            if os.path.isfile(where):
                return True
            continue
        with children:
            for c in children:
                if not c.name.lower().endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(c.path, "entry_points.txt"), "rb") as f:
                        text = f.read()
                except OSError:  # none (or an .egg-info file): declares nothing
                    continue
                if group in text and key in text:
                    return True
    return False


def contract(model: str) -> Contract | None:
    """The contract for a model, or None when no adapter for it is installed (a model no
    distribution can declare is known absent without importlib.metadata: `_may_declare`)."""
    if not _may_declare(model) or model not in _eps():
        return None
    return adapter(model).contract
