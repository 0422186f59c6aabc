"""M-RoPE section layout: B's cos / sin are the same rotary angles of the same three-axis position
ids, but each frequency takes its position from another axis (t, h or w) than A's does.

This is no column permutation: frequency j keeps column j on both sides, only the position it
multiplies changes (Qwen2-VL's chunked sections, t block then h block then w block, against
Qwen3-VL's interleaved t, h, w, t, h, w, ...). So the hypothesis is tested from the boundary's
input, the position ids [3, S] (the `positions` boundary): the frequencies are read off A itself
(two rows whose ids differ by one on every axis: text rows), then each column's axis is the one
whose positions reproduce it, on each side. It is reported when A is exactly such an M-RoPE, B's
axes differ, and B's prediction explains its error.
"""
from __future__ import annotations

import numpy as np

from tensordiff.judge.diagnosis.finding import Finding, explained
from tensordiff.judge.diagnosis.matrix import Matrix

MAX_ELEMENTS = 1 << 22  # a cos / sin pair is read whole (S x head_dim: 2B at 16k tokens is 2M)
FIT_REL = 1e-6  # A must be reproduced to within rounding for its frequencies and axes to be trusted
AXES = "thw"


def _read(st) -> np.ndarray:
    with Matrix(st) as m:
        return m.read(0, m.rows)


def _position_ids(inputs_a: dict, rows: int) -> np.ndarray | None:
    for st in inputs_a.values():
        if not st.dtype.is_float and tuple(st.shape) == (3, rows):
            return _read(st)
    return None


def _frequencies(cos: np.ndarray, sin: np.ndarray, pos: np.ndarray) -> np.ndarray | None:
    """Each column's angle per unit of position, from two rows one step apart on every axis."""
    step = np.flatnonzero((np.diff(pos, axis=1) == 1).all(0))
    if step.size == 0:
        return None
    r = int(step[0])
    z = (cos[r + 1] + 1j * sin[r + 1]) * (cos[r] - 1j * sin[r])
    f = np.angle(z)
    return f if (f > 0).all() else None  # |f| < pi: a default RoPE's frequencies are at most 1


def _axes(cos: np.ndarray, sin: np.ndarray, pos: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, float]:
    """(the axis index of every column, the squared residual of that fit)."""
    ang = pos[:, :, None] * f[None, None, :]  # [3, S, H]
    err = ((np.cos(ang) - cos[None]) ** 2).sum(1) + ((np.sin(ang) - sin[None]) ** 2).sum(1)  # [3, H]
    axis = err.argmin(0)
    return axis, float(err[axis, np.arange(f.size)].sum())


def describe(axis: np.ndarray) -> str:
    """'interleaved (t, h, w, t, h, w, ...; sections [24, 20, 20])', 'chunked (t 0–23, h 24–43, w 44–63)'."""
    counts = [int((axis == k).sum()) for k in range(3)]
    n = axis.size
    inter = np.zeros(n, dtype=axis.dtype)  # as transformers lays it: h at 1, 4, ... (s_h of them), w at 2, 5, ...
    inter[1:3 * counts[1]:3], inter[2:3 * counts[2]:3] = 1, 2
    if (inter == axis).all() and counts[1] and counts[2]:
        return f"interleaved (t, h, w, t, h, w, …; sections {counts})"
    if (np.diff(axis) >= 0).all():
        edges, lo = [], 0
        for k in range(3):
            if counts[k]:
                edges.append(f"{AXES[k]} {lo}–{lo + counts[k] - 1}")
                lo += counts[k]
        return f"chunked ({', '.join(edges)} of {n} frequencies)"
    return "axes " + "".join(AXES[k] for k in axis)


def mrope_findings(names_a: dict, names_b: dict, inputs_a: dict) -> list[Finding]:
    """`names_*`: the boundary's tensors (name -> StoredTensor); `inputs_a`: A's tensors of the
    boundary's inputs, where the position ids are looked for."""
    out = []
    for n in names_a:
        if not n.endswith(".cos"):
            continue
        m = n[: -len(".cos")] + ".sin"
        sts = [names_a[n], names_a.get(m), names_b.get(n), names_b.get(m)]
        if any(s is None or not s.dtype.is_float or tuple(s.shape) != tuple(sts[0].shape) or len(s.shape) != 2
               for s in sts) or sts[0].numel > MAX_ELEMENTS or sts[0].shape[1] % 2:
            continue
        rows, d = sts[0].shape
        pos = _position_ids(inputs_a, rows)
        if pos is None:
            continue
        ca, sa, cb, sb = (_read(s) for s in sts)
        h = d // 2
        if not all(np.array_equal(x[:, :h], x[:, h:]) for x in (ca, sa)):
            continue  # not the rotate-half form (each frequency twice): another layout's business
        f = _frequencies(ca[:, :h], sa[:, :h], pos)
        if f is None:
            continue
        axis_a, res_a = _axes(ca[:, :h], sa[:, :h], pos, f)
        if res_a > FIT_REL * (ca[:, :h] ** 2 + sa[:, :h] ** 2).sum():
            continue  # A is no M-RoPE of these ids
        axis_b, _ = _axes(cb[:, :h], sb[:, :h], pos, f)
        if (axis_a == axis_b).all():
            continue
        ang = np.concatenate([pos[axis_b, :].T * f[None, :]] * 2, axis=1)  # [S, D]: B's axes, A's frequencies
        err = ((cb - ca) ** 2).sum() + ((sb - sa) ** 2).sum()
        res = ((cb - np.cos(ang)) ** 2).sum() + ((sb - np.sin(ang)) ** 2).sum()
        moved = int((axis_a != axis_b).sum())
        out.append(Finding(f"{n} / {m}", "columns", "mrope-sections",
                           f"B's M-RoPE frequencies take their position axis {describe(axis_b)} where A's are "
                           f"{describe(axis_a)} ({moved} of {h} frequencies on another axis): an M-RoPE "
                           "section layout, chunked vs interleaved (Qwen2-VL vs Qwen3-VL)"
                           if {"interleaved", "chunked"} == {describe(x).split()[0] for x in (axis_a, axis_b)}
                           else f"B's M-RoPE frequencies take their position axis {describe(axis_b)} where A's are "
                           f"{describe(axis_a)} ({moved} of {h} frequencies on another axis)",
                           explained(err, res)))
    return out
