"""The DeepSeek vision stages run the tower's own pieces: fed the engine's OWN tensors they give
back the engine's tensors bit for bit; a fault planted only in the stages breaks its boundary."""
import dataclasses

import pytest

from engine.deepseek_v41_flash.stages import make_stages
import tensordiff.models.deepseek_v41_flash.faults as D


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


def test_the_stages_declare_they_replay_a_run_on_the_eager_block(case):
    # what the test above proves (the run's own outputs, bit for bit) is what `replays_run`
    # promises local error; the CPU runs the eager block, so every vision stage says so
    req, rec = case
    stages = make_stages(req, rec.run)
    assert {n: getattr(s, "replays_run", None) for n, s in stages.items()} == dict.fromkeys(stages, True)


@pytest.mark.parametrize("fuse,eager", [("off", [True, True, True]), ("auto", [True, False, False]),
                                        ("on", [False, False, False])])
def test_which_forwards_run_the_eager_block(case, fuse, eager):
    # a run's image k is its engine's forward k + 1: under `auto` the second image on runs the
    # compiled block, which the stages (eager) do not replay
    from engine.deepseek_v41_flash.run import engine_for

    tower = engine_for(case[0]).tower
    tower.fuse = fuse
    assert [tower.eager_at(n) for n in (1, 2, 3)] == eager
    assert [tower.block_fn() is tower.block for _ in range(3)] == eager
