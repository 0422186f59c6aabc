"""Comparing dumps as a user does: each dump's model's contract from the registry, then the walk.

    report = compare_dumps("dumps/oracle", "dumps/engine")
    report.verdict      # "match" | "diverged"
    report.earliest     # root boundaries: diverged while all their inputs match

`tensordiff.judge.walk` walks a contract it is handed; this layer knows the models (the registry)
and the inputs (the picture notes), so it finds the contract and adds what the run's inputs say.
"""
from __future__ import annotations

from pathlib import Path

from tensordiff.format.dump import Dump, open_dump
from tensordiff.judge.floor import DEFAULT_RULE, FloorRule
from tensordiff.judge.contract import Contract
from tensordiff.judge.judge import Judge
from tensordiff.judge.result import Report
from tensordiff.judge.walk import open_pair, walk_dumps
from tensordiff.pipeline import registry
from tensordiff.pipeline.inputs import notes as picture_notes


def contract_of(model: str, given: Contract | None, tolerances=None) -> Contract | None:
    """The contract a comparison walks: a ready `Judge`'s, the one given, else the model's registered one."""
    if isinstance(tolerances, Judge):
        return tolerances.contract
    return given or registry.contract(model)


def compare_dumps(a: str | Path | Dump, b: str | Path | Dump, tolerances=None, *, contract: Contract | None = None,
                  **kw) -> Report:
    """Compare every boundary of A (reference) and B (candidate): `walk_dumps` on the model's
    contract, with the picture notes of the run's inputs. Keywords as `walk_dumps`."""
    da, db = open_pair(a, b)
    rep = walk_dumps(da, db, tolerances, contract=contract_of(da.model, contract, tolerances), **kw)
    rep.notes += picture_notes(da.run or db.run)
    return rep


def three_way(ref: str | Path | Dump, floor: str | Path | Dump, cand: str | Path | Dump,
              rule: FloorRule = DEFAULT_RULE, *, contract: Contract | None = None, tolerances=None,
              profile: dict | None = None, **kw) -> Report:
    """The numeric pass: the candidate's error against the fp32 reference as a multiple of the
    floor run's (the oracle in the candidate's precision), on the model's contract. `profile`:
    {tensor name: {stat: {min, median, max, n}}} from a calibration."""
    dr = ref if isinstance(ref, Dump) else open_dump(ref)
    return walk_dumps(dr, cand, tolerances, contract=contract_of(dr.model, contract, tolerances), floor=floor,
                      floor_rule=rule, profile=profile, **kw)
