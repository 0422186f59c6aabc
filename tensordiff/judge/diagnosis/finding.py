"""One confirmed hypothesis: what B is in terms of A, and how much of the error it removes."""
from __future__ import annotations

import math
from dataclasses import dataclass

# A hypothesis that removes less than this share of the squared error explains too little to
# name: the divergence is then reported as having no simple explanation. A layout bug is removed
# whole, to within rounding (98-100% on the planted faults); a change that merely resembles a
# scale (tanh against identity: 85%) leaves more than this behind.
MIN_EXPLAINED = 0.95


@dataclass(frozen=True)
class Finding:
    tensor: str
    kind: str  # rows | columns | scale | offset | sign | pair | sizes
    name: str  # a short id of the hypothesis ("shift", "merge-vs-raster", "interleaved-halves", ...)
    text: str  # "B equals A with ..."
    explained: float  # 1 - residual / error, over the whole tensor (exact counts for integer tensors)

    @property
    def line(self) -> str:
        return f"{self.tensor}: {self.text}; explains {_pct(self.explained)} of the error"

    def as_json(self) -> dict:
        return {"tensor": self.tensor, "kind": self.kind, "name": self.name, "text": self.text,
                "explained": round(self.explained, 6), "line": self.line}


def _pct(x: float) -> str:
    # rounded down: 99.96% is not "100%" unless nothing is left
    return "100%" if x >= 1.0 else f"{math.floor(1000 * x) / 10:.1f}%"


def explained(error: float, residual: float) -> float:
    """The share of the squared error a hypothesis removes (0 when it adds error)."""
    if error <= 0:
        return 0.0
    return max(0.0, min(1.0, 1.0 - residual / error))
