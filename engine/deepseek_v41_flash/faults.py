"""Named bugs the engine can carry on purpose (all off by default).

Each is a mistake this field really makes; each must be caught by the comparator at the boundary
named here (the adapter lists the same faults for `tensordiff faults`).
"""
from __future__ import annotations

from ..errors import EngineInputError

FAULTS: dict[str, tuple[str, str]] = {
    # name: (boundary that must diverge first, what the bug is)
    "contain-ceil": ("plan", "contain rounds the short side with ceil instead of round"),
    "rope-interleaved": ("rope", "2D RoPE angles interleaved (row, col, row, col...) instead of blocked"),
    "aligner-flat-pad": ("aligner", "zero rows appended to the flattened patches instead of a right/bottom grid pad"),
    "gelu-tanh": ("aligner", "tanh-approximated GELU in the aligner instead of the exact erf GELU"),
    "patch-pad-nonzero": ("block0", "the 588 -> 592 padding columns of the patch projection are not zero"),
}


# The language backbone's faults live with it (`language/model.py`); named here so one
# `--fault` reaches the right half and an unknown name is still refused.
LANGUAGE = ("router-text-bias-for-images", "router-biased-weights", "engram-ngram-across-image",
            "overlay-chunk-shift")


def check(fault: str | None) -> str | None:
    """The vision engine's fault (None when the fault belongs to the language backbone)."""
    if fault is not None and fault not in FAULTS and fault not in LANGUAGE:
        known = ", ".join((*FAULTS, *LANGUAGE))
        raise EngineInputError(f"unknown fault {fault!r} for deepseek-v4.1-flash (known: {known})")
    return fault if fault in FAULTS else None


def language(fault: str | None) -> str | None:
    """The language backbone's fault, or None."""
    return fault if fault in LANGUAGE else None
