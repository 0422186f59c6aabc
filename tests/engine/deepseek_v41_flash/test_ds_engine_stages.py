"""The DeepSeek vision stages run the tower's own pieces: fed the engine's OWN tensors they give
back the engine's tensors bit for bit; a fault planted only in the stages breaks its boundary."""
import dataclasses

import pytest

from engine.deepseek_v41_flash.stages import make_stages
from tensordiff.models import deepseek_faults as D


@pytest.fixture(scope="module")
def case(own_run):
    return own_run("deepseek-v4.1-flash")


def test_stages_on_the_engines_own_tensors_reproduce_it(case, stages_on_own_tensors):
    req, rec = case
    out = stages_on_own_tensors(make_stages, req, rec)
    assert set(out) == {"block0", "final_norm", "aligner"}
    for name, t in out.items():
        assert t.dtype == rec.tensors[name].dtype and t.equal(rec.tensors[name]), name


@pytest.mark.parametrize("fault,broken", [(D.GELU_TANH, {"aligner"}), (D.PATCH_PAD_NONZERO, {"block0"})])
def test_a_fault_planted_in_the_stages_breaks_its_boundary_only(case, stages_on_own_tensors, fault, broken):
    req, rec = case
    out = stages_on_own_tensors(make_stages, dataclasses.replace(req, fault=fault), rec)
    assert {n for n, t in out.items() if not t.equal(rec.tensors[n])} == broken
