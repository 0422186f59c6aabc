"""Geometry coverage: which discrete preprocessing rules a gate's images exercise.

Some bugs only change numbers for some image sizes (a flat pad needs a grid width that is not a
multiple of 3; a ceil-for-round bug needs a side where the two differ). A gate whose images
never reach a rule cannot catch a bug in it, and says so. Each adapter declares its rules as
predicates over the `plan` boundary the oracle dumped (its integers, by tensor name), so the
toolkit needs no model code to tell which rule an image exercises.

    rules = exercised(adapter, dump)          # names of the rules this image exercises
    cov = Coverage.of(adapter.geometry, {label: rules, ...})
    cov.missing                               # rules no image exercises: the gate warns
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

Plan = Mapping[str, tuple[int, ...]]  # plan tensor name -> its integers (flattened)


@dataclass(frozen=True)
class Rule:
    name: str
    meaning: str
    test: Callable[[Plan], bool] = field(compare=False)


def read_plan(dump) -> Plan:
    """The `plan.*` integers of a dump (empty when it has no plan boundary)."""
    out = {}
    for e in dump.entries:
        if not e.name.startswith("plan.") or e.dtype.is_float:
            continue
        r = e.stored.reader()
        try:
            out[e.name] = tuple(int(v) for v in np.asarray(r.read(0, e.stored.numel)).reshape(-1))
        finally:
            r.close()
    return out


def exercised(rules: tuple[Rule, ...], dump) -> list[str]:
    plan = read_plan(dump)
    if not plan:
        return []
    out = []
    for r in rules:
        try:
            if r.test(plan):
                out.append(r.name)
        except (KeyError, IndexError, ZeroDivisionError):
            continue  # a plan from another version lacks a field: the rule is not shown exercised
    return out


@dataclass(frozen=True)
class Coverage:
    rules: tuple[Rule, ...]
    by_image: dict[str, list[str]]  # case label -> rules it exercises

    @classmethod
    def of(cls, rules: tuple[Rule, ...], by_image: dict[str, list[str]]) -> "Coverage":
        return cls(tuple(rules), dict(by_image))

    @property
    def missing(self) -> list[str]:
        hit = {n for names in self.by_image.values() for n in names}
        return [r.name for r in self.rules if r.name not in hit]

    def warnings(self, model: str) -> list[str]:
        means = {r.name: r.meaning for r in self.rules}
        return [f"warning: no {model} image exercises the geometry rule `{n}` ({means[n]}): a bug there goes unseen"
                for n in self.missing]

    def as_json(self) -> dict:
        return {"rules": {r.name: {"meaning": r.meaning,
                                   "images": [lbl for lbl, names in self.by_image.items() if r.name in names]}
                          for r in self.rules},
                "missing": self.missing}
