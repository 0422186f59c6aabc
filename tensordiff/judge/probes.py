"""Semantic probes: a property one side's tensors must hold on their own, whatever the other
side says. A probe catches a mislabelled or half-computed tensor that is still close in value
(sin written under cos, a norm's output scaled by a constant within tolerance).

One registry, `PROBES`, by the name a contract's `Boundary.probes` uses; a contract naming a
probe that is not here is refused when it is built (`contract.Boundary`).

A probe sees one side of one boundary: `check(entries, results, side)` with `entries` the
side's tensors by name (dump entries) and `results` the tensors' comparison results (their
metrics hold the value ranges), and returns {tensor name: (holds?, detail)} for the tensors it
applies to, nothing when it does not apply (a tensor missing, an integer tensor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tensordiff.format.dtypes import narrower, to_float64
from tensordiff.judge.metrics import FloatResult

CHUNK = 1 << 20  # elements read per step


@dataclass(frozen=True)
class Probe:
    name: str
    meaning: str
    check: Callable[[dict, dict, str], dict[str, tuple[bool, str]]]


def _read_chunks(entry, step: int = CHUNK):
    r = entry.stored.reader()
    try:
        for s in range(0, entry.stored.numel, step):
            yield to_float64(r.read(s, min(entry.stored.numel, s + step)), entry.dtype)
    finally:
        r.close()


def _within_unit(entries: dict, results: dict, side: str) -> dict[str, tuple[bool, str]]:
    out = {}
    for name, res in results.items():
        if not isinstance(res.metrics, FloatResult):  # the value range comes with the float metrics
            continue
        lo, hi = res.metrics.range[0 if side == "a" else 1]
        out[name] = (lo >= -1 - 1e-6 and hi <= 1 + 1e-6), f"values in [{lo:.4g}, {hi:.4g}]"
    return out


def _unit_circle(entries: dict, results: dict, side: str) -> dict[str, tuple[bool, str]]:
    cos = next((e for n, e in entries.items() if n.endswith(".cos")), None)
    sin = next((e for n, e in entries.items() if n.endswith(".sin")), None)
    if cos is None or sin is None or cos.shape != sin.shape or not (cos.dtype.is_float and sin.dtype.is_float):
        return {}
    err = 0.0
    for c, s in zip(_read_chunks(cos), _read_chunks(sin)):
        if c.size:
            err = max(err, float(np.nanmax(np.abs(c * c + s * s - 1))))
    # each of cos, sin carries a rounding of its dtype; squared and summed: a few units
    bound = 8 * narrower(cos.dtype, sin.dtype).unit_roundoff + 1e-6
    detail = f"max |cos²+sin²−1| = {err:.3g}"
    return {cos.name: (err <= bound, detail), sin.name: (err <= bound, detail)}


def _unit_rms(entries: dict, results: dict, side: str) -> dict[str, tuple[bool, str]]:
    """Every row (last dimension) of a float tensor has RMS 1: a norm without an affine weight."""
    out = {}
    for name, e in entries.items():
        if not e.dtype.is_float or not e.shape or e.shape[-1] == 0:
            continue
        d = int(e.shape[-1])
        step = max(d, (CHUNK // d) * d)  # whole rows per read
        worst = 0.0
        for x in _read_chunks(e, step):
            rows = x.reshape(-1, d)
            rms = np.sqrt(np.mean(rows * rows, axis=1))
            if rms.size:
                worst = max(worst, float(np.nanmax(np.abs(rms - 1))) if np.isfinite(rms).all() else math.inf)
        # each element carries one rounding of the stored dtype; the mean of squares a few more
        bound = 8 * e.dtype.unit_roundoff + 1e-6
        out[name] = worst <= bound, f"max |row RMS − 1| = {worst:.3g}"
    return out


PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("within-unit", "every value in [-1, 1]", _within_unit),
    Probe("unit-circle", "cos² + sin² = 1 across `<b>.cos` / `<b>.sin`", _unit_circle),
    Probe("unit-rms", "every row (last dimension) has RMS 1: a norm without an affine weight", _unit_rms),
)}
