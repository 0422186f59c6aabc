"""Sizes: the integer preprocessing decisions (`plan`) differ. The fields are named by the
boundary's meaning in the contract ("plan.size [src_w, src_h, ...]"), so the finding says which
size moved, by how many pixels, and what rounding that is consistent with."""
from __future__ import annotations

import re

import numpy as np

from tensordiff.format.dtypes import to_float64
from tensordiff.judge.diagnosis.finding import Finding

FIELDS = re.compile(r"([\w.]+) \[([^\]]+)\]")
SIZES_MAX = 64  # integer elements of one plan tensor: decisions, not data


def field_names(meaning: str) -> dict[str, list[str]]:
    return {m.group(1): [f.strip() for f in m.group(2).split(",")] for m in FIELDS.finditer(meaning or "")}


def _load(st) -> np.ndarray:
    r = st.reader()
    try:
        return to_float64(r.read(0, st.numel), st.dtype) if st.dtype.is_float else r.read(0, st.numel).astype(np.int64)
    finally:
        r.close()


def size_findings(meaning: str, names_a: dict, names_b: dict) -> list[Finding]:
    """One finding over every differing plan element: what changed, by how much."""
    fields = field_names(meaning)
    diffs = []
    for n, sa in names_a.items():
        sb = names_b.get(n)
        if sb is None or sa.shape != sb.shape or sa.numel > SIZES_MAX or sa.dtype.is_float:
            continue
        xa, xb = _load(sa), _load(sb)
        for k in np.flatnonzero(xa != xb):
            label = fields.get(n, [])
            label = label[k] if k < len(label) else f"{n}[{k}]"
            diffs.append((n, label, int(xa[k]), int(xb[k])))
    if not diffs:
        return []
    first = diffs[0]
    parts = [f"{label} {b} vs A's {a} ({b - a:+d})" for _, label, a, b in diffs[:6]]
    more = f" and {len(diffs) - 6} more" if len(diffs) > 6 else ""
    if all(abs(b - a) == 1 for _, _, a, b in diffs):
        up = all(b > a for _, _, a, b in diffs)
        why = (" (consistent with rounding up, ceil, where A rounds to the nearest)" if up else
               " (consistent with rounding down, floor, where A rounds to the nearest)"
               if all(b < a for _, _, a, b in diffs) else "")
        return [Finding(first[0], "sizes", "resize-by-one", f"B resized by one pixel: {', '.join(parts)}{more}{why}", 1.0)]
    return [Finding(first[0], "sizes", "size-differs", f"B's preprocessing sizes differ: {', '.join(parts)}{more}", 1.0)]
