"""Decode steps that a captured CUDA graph froze: the check behind a note of `compare` and `inspect`.

A decode step is a tensor named `X.step.K` (K >= 1; the prompt's is `X`; a suffix may follow the
step, as in `token.step.K.ids`): the name tensordiff's own runs and its importers give step K
(`import sglang`: the dumper's step S as `.step.(S - first)`). Its family is the name without
`.step.K`, and the family's layer the first dotted part of that name which is a number
(`model.layers.3.mlp.output` -> 3, `hidden.3` -> 3, `mlp_up.layer_id.0` -> 0; `logits`: none).

A tap inside a captured graph records the capture's buffer, which every replay overwrites: each
step's record then holds the same (the last replay's) values. The check: a family is frozen when
it has at least two decode steps and all of them are bit-identical (same shape, element type and
sha256 of the stored bytes); the note is given when the frozen families lie in at least two
different layers. Real decode steps differ (another token, another position), and one constant
tensor (a request's pool index) or one layer's is not the signature; a graph freezes them all.
"""
from __future__ import annotations

import re

from tensordiff.format.dump import Dump, Entry

STEP = re.compile(r"\A(?P<base>.+?)\.step\.(?P<k>[1-9][0-9]*)(?P<rest>(?:\.[^.]+)*)\Z")
NUMBER = re.compile(r"\A(?:0|[1-9][0-9]*)\Z")


def family(name: str) -> tuple[str, int] | None:
    """(family, step) of a decode-step name, else None."""
    m = STEP.match(name)
    return (m["base"] + m["rest"], int(m["k"])) if m else None


def layer_of(fam: str) -> int | None:
    return next((int(p) for p in fam.split(".") if NUMBER.match(p)), None)


def _digest(e: Entry, read: bool) -> str | None:
    """The stored bytes' sha256: the manifest's, each rank part's for a merged tensor, or (when
    `read`) computed; None when it would need a read that is not allowed."""
    if e.sha256:
        return e.sha256
    parts = getattr(e.stored, "parts", None)
    if parts and all(p.sha256 for p in parts):
        return "|".join(f"{p.rank}:{p.sha256}" for p in parts)
    return e.computed_sha256() if read else None


def frozen_families(d: Dump, *, read: bool = True) -> dict[str, tuple[int, list[int]]]:
    """{family: (layer, its decode steps)} of the families whose decode steps are all
    bit-identical; families without a layer, or whose digest needs a read not allowed, are left out."""
    fams: dict[str, dict[int, Entry]] = {}
    for e in d.entries:
        f = family(e.name)
        if f is not None:
            fams.setdefault(f[0], {})[f[1]] = e
    out = {}
    for fam, steps in fams.items():
        layer = layer_of(fam)
        if len(steps) < 2 or layer is None:
            continue
        seen = set()
        for e in steps.values():
            digest = _digest(e, read)
            if digest is None:
                break
            seen.add((tuple(e.shape), e.dtype.name, digest))
            if len(seen) > 1:
                break
        else:
            out[fam] = (layer, sorted(steps))
    return out


def note(d: Dump, *, read: bool = True) -> str | None:
    """The note for `d` when its decode steps are frozen in two or more layers, else None."""
    frozen = frozen_families(d, read=read)
    layers = sorted({layer for layer, _ in frozen.values()})
    if len(layers) < 2:
        return None
    fam, (_, steps) = next(iter(frozen.items()))
    shown = ", ".join(str(x) for x in layers[:8]) + (", ..." if len(layers) > 8 else "")
    return (f"{d.path}: the decode steps of {len(frozen)} tensor(s) in layers {shown} are bit-identical from step "
            f"to step (e.g. {fam} at steps {steps[0]}..{steps[-1]}): the signature of a CUDA graph replaying one "
            "buffer, recorded once at capture; dump decode eagerly (SGLang --disable-cuda-graph, vLLM "
            "--enforce-eager) or record outside the graph")
