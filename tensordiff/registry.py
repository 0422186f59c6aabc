"""Finds model adapters through the `tensordiff.models` entry-point group.

This is the only place in `tensordiff` that reaches model code, and it does so lazily: the
core (format, compare, report) works with no model installed.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .errors import BadInput

if TYPE_CHECKING:  # the adapter machinery (faults, options) loads only when an adapter does
    from .adapter import ModelAdapter
    from .contract import Contract

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
    from .adapter import ModelAdapter

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
                       "not a tensordiff.adapter.ModelAdapter")
    if obj.name != name:
        raise BadInput(f"entry point {name!r} of {dist} gives the adapter of {obj.name!r}; the two names must agree")
    return obj


def contract(model: str) -> Contract | None:
    """The contract for a model, or None when no adapter for it is installed."""
    if model not in _eps():
        return None
    return adapter(model).contract
