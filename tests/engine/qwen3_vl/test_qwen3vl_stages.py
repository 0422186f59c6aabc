"""The Qwen3-VL tower's pieces are written once: its local-error stages, fed the engine's OWN
tensors, give back the engine's tensors bit for bit (a stage holding its own copy of the merger
would drift from the tower's); a fault planted only in the stages breaks exactly its boundary.
The run also writes its speed path (the SDPA kernel used, any fallback) into the manifest."""
import dataclasses

import pytest
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.qwen3_vl.stages import make_stages
import tensordiff.models.qwen3_vl.faults as Q


@pytest.fixture(scope="module")
def case(own_run):
    return own_run("qwen3-vl")


def test_stages_on_the_engines_own_tensors_reproduce_it(case, stages_on_own_tensors):
    req, rec = case
    out = stages_on_own_tensors(make_stages, req, rec)
    assert {"block0", "final_norm", "aligner", "deepstack.0"} <= set(out)
    for name, t in out.items():
        assert t.dtype == rec.tensors[name].dtype and t.equal(rec.tensors[name]), name


@pytest.mark.parametrize("fault,broken", [(Q.MERGER_GELU_TANH, {"aligner"}),
                                          (Q.DEEPSTACK_DROP, {"deepstack.0", "deepstack.1", "deepstack.2"})])
def test_a_fault_planted_in_the_stages_breaks_its_boundary_only(case, stages_on_own_tensors, fault, broken):
    req, rec = case
    out = stages_on_own_tensors(make_stages, dataclasses.replace(req, fault=fault), rec)
    assert {n for n, t in out.items() if not t.equal(rec.tensors[n])} == broken & set(out)


def test_the_manifest_names_the_sdpa_kernel_and_a_forced_math_fallback(case, own_run):
    sp = case[1].run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "auto", "policy": "off", "ran": "eager"}  # CPU: no compiled route
    assert list(sp["attention"]["sdpa"]) == ["flash"] and sp["fallbacks"] == []
    with sdpa_kernel([SDPBackend.MATH]):
        _, rec = own_run("qwen3-vl")
    sp = rec.run["speed_path"]
    assert list(sp["attention"]["sdpa"]) == ["math"]
    assert sp["fallbacks"] == [{"what": "sdpa flash -> math",
                                "why": "flash is disabled (torch.backends.cuda.flash_sdp_enabled() is False)"}]
    assert set(rec.run) >= {"inputs", "speed_path"}  # model facts only: the core writes the provenance


@pytest.mark.parametrize("fault", [None, Q.DECODE_NO_DELTA])
def test_decode_steps_sharing_the_prefill_give_each_step_decoded_afresh(own_run, fault):
    """The decode stages reuse the `hidden.L` stages' KV caches and one decode stepped in order;
    each step K is what a stage decoding K steps from its own teacher-forced prefill gives (the
    route before the sharing), bit for bit, clean and with a decode fault planted."""
    req, rec = own_run("qwen3-vl", prompt="Describe <image> in one sentence.", chunk=12, decode=2)
    req = dataclasses.replace(req, fault=fault)
    inputs = dict(rec.tensors)
    shared = {}
    for stage in make_stages(req, rec.run).values():  # in the order local error runs them
        shared.update(stage(inputs))
    for k in (2, 1):  # each alone, on stages of its own (no hidden stage ran first); 2 before 1
        alone = make_stages(req, rec.run)[f"logits.step.{k}"](inputs)[f"logits.step.{k}"]
        assert alone.equal(shared[f"logits.step.{k}"]), k
    if fault is None:  # fed the run's own tensors, the steps are the run's own
        for k in (1, 2):
            assert shared[f"logits.step.{k}"].equal(rec.tensors[f"logits.step.{k}"]), k


def test_a_decode_step_fed_other_inputs_decodes_them_not_the_memo(own_run):
    """A diagnosis replay feeds a stage other inputs: the shared prefill and decode are reused
    only on the inputs they read, so a step fed a changed stream is that stream's own step."""
    req, rec = own_run("qwen3-vl", prompt="Describe <image> in one sentence.", chunk=12, decode=2)
    inputs = dict(rec.tensors)
    stages = make_stages(req, rec.run)
    for name, stage in stages.items():
        if not name.startswith("logits.step."):
            stage(inputs)
    changed = {**inputs, "deepstack_add.1": inputs["deepstack_add.1"] * 1.5}  # layer 2 enters from it
    got = stages["logits.step.2"](changed)["logits.step.2"]
    fresh = make_stages(req, rec.run)["logits.step.2"](changed)["logits.step.2"]
    assert fresh.equal(got) and not got.equal(rec.tensors["logits.step.2"])
    assert stages["logits.step.1"](inputs)["logits.step.1"].equal(rec.tensors["logits.step.1"])  # and back
