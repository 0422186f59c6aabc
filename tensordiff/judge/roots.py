"""Where a divergence starts: root, consequent and cascade, on the contract's DAG.

A failing boundary whose present inputs all match (an absent input is seen through to its own
inputs) is a root; one fed by a failing boundary is consequent. A boundary downstream of a top-k
choice that flipped on a near-tie (`benign`) and diverged end to end only through it is that
flip's cascade: information, judged by local error (the stage on the reference's tensors).
"""
from __future__ import annotations

from tensordiff.judge import rank_check
from tensordiff.judge.contract import Boundary
from tensordiff.judge.result import FAILING, BoundaryResult


def assign_roots(bounds: list[Boundary], present: list[Boundary], results: dict[str, BoundaryResult]) -> None:
    """Each present boundary's effective inputs, and its place: root, consequent or cascade."""
    by = {b.name: b for b in bounds}

    def effective_inputs(b: Boundary, seen: set[str]) -> list[str]:
        out: list[str] = []
        for i in b.inputs:
            if i in seen:
                continue
            seen.add(i)
            if i in results:
                out.append(i)
            elif i in by:
                out.extend(effective_inputs(by[i], seen))
        return out

    after_flip: set[str] = set()  # boundaries downstream of a top-k choice that flipped on a near-tie
    for b in present:
        br = results[b.name]
        br.inputs = effective_inputs(b, set())
        if br.status == "benign" or any(i in after_flip for i in br.inputs):
            after_flip.add(b.name)
        if br.status not in FAILING:
            continue
        if any(results[i].status in FAILING + ("consequent",) for i in br.inputs):
            if br.status == "diverged":
                br.status = "consequent"
        elif br.status == "diverged" and any(i in after_flip for i in br.inputs) and not rank_check.definite(br):
            # fed (through any path) by a choice that flipped on a near-tie: the difference end to
            # end is that flip's cascade; the stage itself is judged by local error. A rank
            # finding (replicas that differ, a misplaced shard) is no flip's cascade: it stays
            br.status = "cascade"
        else:
            br.root = True
