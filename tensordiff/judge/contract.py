"""Boundary contracts: which boundaries a model has, what they mean, and the DAG between them.

"Earliest" is topological: a boundary is a root of a divergence when it diverges while all of
its inputs match. With no contract for a model, the manifest order is the order (a chain).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tensordiff.errors import BadInput
from tensordiff.judge.probes import PROBES

# How the rows of a boundary's tensors map to the picture, used to say what an index means.
#   "grid":  row r is patch (r // w, r % w) of run.inputs.grid = [h, w]
#   "merge": rows in 2x2-merge order over run.inputs.grid = [h, w] (Qwen3-VL)
#   "cells": row r is token (r // w, r % w) of run.inputs.cells = [h, w]
#   "merged": rows are 2x2 groups in raster order of run.inputs.grid // 2
#   "tokens": row r is sequence position r
#   "plain": no meaning beyond the index
LAYOUTS = ("grid", "merge", "cells", "merged", "tokens", "plain")
# How a tensor's two sides are compared: float values within tolerance, exactly equal, or top-k
# id rows as sets.
# scores: the key a top-k ranked, kept beside its `.ids` for the tie rule, not judged as values
MODES = ("values", "exact", "topk-sets", "scores")


@dataclass(frozen=True)
class Boundary:
    name: str
    inputs: tuple[str, ...] = ()
    meaning: str = ""
    layout: str = "plain"
    # Semantic probes run on each side alone; they catch a mislabelled tensor. Names from
    # `tensordiff.judge.probes.PROBES`: "unit-circle", "within-unit", "unit-rms".
    probes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # refused here, when the contract is built, not on the first comparison that reaches it
        if self.layout not in LAYOUTS:
            raise ContractError(f"boundary {self.name!r}: unknown layout {self.layout!r} (known: {', '.join(LAYOUTS)})")
        for p in self.probes:
            if p not in PROBES:
                raise ContractError(f"boundary {self.name!r}: unknown probe {p!r} (known: {', '.join(PROBES)})")


class ContractError(BadInput):
    """A contract that names something tensordiff does not know (a probe, a layout, a mode)."""


@dataclass(frozen=True)
class TensorRule:
    """How tensors whose name matches `pattern` (fnmatch) are compared."""

    pattern: str
    mode: str  # "values" | "exact" | "topk-sets" | "scores"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ContractError(f"tensor rule {self.pattern!r}: unknown mode {self.mode!r} (known: {', '.join(MODES)})")


@dataclass(frozen=True)
class Contract:
    model: str
    boundaries: tuple[Boundary, ...]
    rules: tuple[TensorRule, ...] = ()
    # For contracts whose boundaries depend on the run (one per layer, per decode step):
    # given the boundary names present in the dumps, return the full boundary list.
    resolver: Callable[[Sequence[str]], tuple[Boundary, ...]] | None = field(default=None, compare=False)
    # Maps a tensor name to its boundary when the first-dot rule is not enough
    # ("router.3.ids" -> "router.3").
    boundary_of: Callable[[str], str] | None = field(default=None, compare=False)
    # Tolerances the model itself knows it needs (fnmatch pattern -> tolerance fields), e.g. a
    # top-k over near-tied scores. A user's file or [tool.tensordiff] overrides them.
    tolerances: dict = field(default_factory=dict, compare=False)
    # how a report names those tolerances' source (default: `contract <model>`)
    tolerances_source: str = field(default="", compare=False)
    # A choice's scores tensor that is a row of another tensor (a generated token's: the logits it
    # is the argmax of) -> that tensor's name: a pass judges those scores by that tensor's verdict.
    scores_source: Callable[[str], str | None] | None = field(default=None, compare=False)

    def resolve(self, present: Sequence[str]) -> tuple[Boundary, ...]:
        known = self.resolver(present) if self.resolver else self.boundaries
        names = {b.name for b in known}
        extra = [p for p in present if p not in names]
        out = list(known)
        for name in extra:  # unknown boundaries follow the last known one in manifest order
            prev = out[-1].name if out else None
            out.append(Boundary(name, inputs=(prev,) if prev else (), meaning="(not in the contract)"))
        return tuple(out)

    def mode_for(self, tensor: str) -> str | None:
        for r in self.rules:
            if fnmatch.fnmatchcase(tensor, r.pattern):
                return r.mode
        return None


def chain(model: str, names: Sequence[str]) -> Contract:
    """The contract of an unknown model: boundaries in manifest order, each fed by the previous."""
    bs = []
    for i, n in enumerate(names):
        bs.append(Boundary(n, inputs=(names[i - 1],) if i else ()))
    return Contract(model, tuple(bs))


def topological(boundaries: Sequence[Boundary]) -> list[Boundary]:
    """Boundaries in an order where every input comes before its consumers (stable)."""
    by = {b.name: b for b in boundaries}
    seen: set[str] = set()
    out: list[Boundary] = []

    def visit(b: Boundary, stack: tuple[str, ...]) -> None:
        if b.name in seen:
            return
        if b.name in stack:
            raise ValueError(f"contract has a cycle through {b.name}")
        for i in b.inputs:
            if i in by:
                visit(by[i], stack + (b.name,))
        seen.add(b.name)
        out.append(b)

    for b in boundaries:
        visit(b, ())
    return out


def ancestors(boundaries: Sequence[Boundary], name: str) -> set[str]:
    by = {b.name: b for b in boundaries}
    out: set[str] = set()
    todo = list(by[name].inputs) if name in by else []
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.add(n)
        if n in by:
            todo.extend(by[n].inputs)
    return out
