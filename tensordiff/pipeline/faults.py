"""Planted engine faults: what each is, the boundary it must trip, and what the run must do for
the fault to change numbers at all.

A fault is only worth planting on a run that takes its route: the DeepSeek router faults live in
the language backbone, so `--fault router-text-bias-for-images` without `--prompt` would run an
engine that never reaches the bug and report MATCH. `Need`s state those conditions once, as
data; `refusal(fault, request)` names the first unmet one, and the request is refused (exit 2)
instead of reporting a silent MATCH.

Two kinds of need:
  - `Need(text, check=...)`: decidable from the request (a prompt, a chunk length, a dtype);
    checked before anything runs.
  - `Need(text)` without a check: a property of the input picture (a grid width, an aspect
    ratio) that the default picture has; documented, listed by `tensordiff faults`, not refused.

No torch here: model adapters and the core import this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# `request` is a RunRequest (or anything with its fields); a check says whether it takes the route.
Check = Callable[[Any], bool]


@dataclass(frozen=True)
class Need:
    """One condition a fault needs; `check` (when given) decides it from the request."""

    text: str  # e.g. "--prompt (the language backbone)"
    check: Check | None = None

    def unmet(self, request) -> bool:
        return self.check is not None and not self.check(request)


def _language(req) -> bool:
    # the same rule as both DeepSeek runners: text is asked for by a prompt or decode steps
    return req.prompt is not None or req.decode > 0


LANGUAGE = Need("--prompt (or --decode), so the run goes on into the language backbone", _language)
CHUNK = Need("--chunk (a chunked prefill)", lambda req: req.chunk is not None)
SEVERAL_IMAGES = Need("two or more images in the prompt (a repeated --image)",
                      lambda req: getattr(req, "images", 1) >= 2)
FLOAT32 = Need("--dtype float32 (the change is below bf16 resolution)", lambda req: req.dtype == "float32")


@dataclass(frozen=True)
class Fault:
    """A real bug the engine can carry on purpose, and the boundary it must be caught at."""

    name: str
    boundary: str  # the earliest boundary the comparator must name (fnmatch pattern allowed)
    description: str
    needs: tuple[Need, ...] | str = ()  # what the input must have for the fault to change numbers

    @property
    def requirements(self) -> tuple[Need, ...]:
        # a plain string (third-party adapters, older tables) is one documented, unchecked need
        if isinstance(self.needs, str):
            return (Need(self.needs),) if self.needs else ()
        return self.needs

    @property
    def needs_text(self) -> str:
        return "; ".join(n.text for n in self.requirements)


def find(faults, name: str) -> Fault:
    for f in faults:
        if f.name == name:
            return f
    raise KeyError(name)


def refusal(fault: Fault, request) -> str | None:
    """Why `request` cannot exercise `fault` (the first unmet checkable need), or None."""
    for need in fault.requirements:
        if need.unmet(request):
            return f"fault {fault.name!r} needs {need.text}; this run would never reach it"
    return None
