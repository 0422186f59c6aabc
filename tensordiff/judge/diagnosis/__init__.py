"""Diagnosis: when a float boundary diverges, say what KIND of wrong it is.

Cheap hypotheses are tested against the stored tensors of both sides (A the reference, B the
candidate): rows moved (`row_maps`), columns permuted inside a row (`column_maps`), a scale, sign
or offset (`affine`), the cos/sin pair swapped (`pairs`), a size off by a pixel (`sizes`). Each
is searched on a sample of rows and confirmed by streaming the whole tensor (`matrix`), and is
reported only when it removes most of the error (`finding.MIN_EXPLAINED`); "no simple
explanation" is a valid answer and is said as such.

    from tensordiff.judge.diagnosis import diagnose_report
    diagnose_report(report, dump_a, dump_b, contract)   # fills BoundaryResult.diagnosis
"""
from __future__ import annotations

from tensordiff.judge.diagnosis.finding import MIN_EXPLAINED, Finding
from tensordiff.judge.diagnosis import run


def __getattr__(name):  # lazy: the hypotheses (numpy work, a dozen modules) load when one is tested
    if name in ("diagnose_boundary", "diagnose_report"):
        return getattr(run, name)
    raise AttributeError(name)


__all__ = ["Finding", "MIN_EXPLAINED", "diagnose_boundary", "diagnose_report"]
