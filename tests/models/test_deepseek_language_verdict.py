"""`check` on the DeepSeek language half in bf16, as the gate judges it: a semantic pass (both
sides float32 in the exact `semantic` language numerics) and a numeric pass (the bf16 engine's
error against that float32 reference as multiples of the oracle's own in the run's numerics,
`official` by default: the floor run). `--passes direct` keeps the one tensor-wide comparison;
there, a layer subset (`--layers`) is judged by local error behind a near-tie flip too.
Tiny config, layers 0-2, on the CPU."""
from __future__ import annotations

import json

import pytest

from cli_runner import run_cli as cli
from tensordiff.format.dump import open_dump
import tensordiff.models.deepseek_v41_flash.faults as D

MODEL = "deepseek-v4.1-flash"
PROMPT = "Describe <image>."
SUBSET = ("--layers", "0-2")


@pytest.fixture(scope="module")
def jpeg(module_tmp):
    """The bundled picture as a JPEG (quality 90): its router.0.ids flips on near-ties in bf16."""
    from PIL import Image

    from tensordiff.pipeline.inputs import default_image_path

    path = module_tmp("verdict") / "picture.jpg"
    Image.open(default_image_path()).convert("RGB").save(path, quality=90)
    return path


def test_bf16_check_runs_both_passes_against_the_exact_reference(tmp_path, capsys):
    out = tmp_path / "dumps"
    code, stdout, err = cli(["check", MODEL, "--dtype", "bfloat16", "--prompt", PROMPT, "--chunk", "5",
                             "--decode", "2", *SUBSET, "--out", out, "--no-cache", "--json", tmp_path / "r.json"],
                            capsys)
    assert code == 0, stdout[-3000:] + err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["passes"] == ["semantic", "numeric"] and rep["pass"] == "semantic" and rep["passed"]
    assert "== semantic pass" in stdout and "== numeric pass" in stdout
    assert "PASS (semantic: match; numeric: match" in stdout
    # a flip of the numeric pass leaves what it feeds to that pass's own local error: clean here
    numeric_local = rep.get("local_error_numeric")
    assert numeric_local is None or numeric_local["origin"] is None, numeric_local["summary"]
    # the numeric pass judges every language boundary against a floor it measured
    num = {b["name"]: b for b in rep["numeric"]["boundaries"]}
    for name in ("embeddings", "attn.0", "router.0.weights", "hidden.0", "engram.1", "attn.2", "hidden.2",
                 "logits", "logits.step.1", "logits.step.2"):
        t = num[name]["tensors"][0]
        assert t["mode"] == "floor" and t["metrics"]["floor"]["rmse"] > 0, (name, t)
    # the choice, explicit: the float32 reference (and the semantic pass) run the exact semantic
    # numerics; the floor run is the oracle in the numerics the engine runs (official: bf16 + kernel rounding)
    facts = {d: open_dump(out / d).run for d in ("oracle", "engine", "oracle-floor", "engine-bfloat16")}
    for d in ("oracle", "engine"):
        assert facts[d]["dtype"] == "float32"
        assert facts[d]["language_numerics"] == {"mode": "semantic", "dtype": "float32", "kernel_quant": False}
    for d in ("oracle-floor", "engine-bfloat16"):
        assert facts[d]["language_numerics"] == {"mode": "official", "dtype": "bfloat16", "kernel_quant": True}


def test_a_decode_bug_is_named_by_the_semantic_pass_the_numeric_one_cannot_tell_it_from_a_tie(tmp_path, capsys):
    """The default bf16 route: the semantic pass (fp32, no flip) names the decode-only bug end to
    end and by its local error. In bf16 its effect on a step is of the size a clean decode step's
    own near-tie flips leave (CPU: the window reset's step 2 at 1.07x the floor run's largest
    prompt row, a clean step up to 0.56x, a clean H200 engine's step past the bf16 tolerance on
    3 of 10 pictures): the numeric pass judges its steps against that floor and passes them,
    its own local error of the steps three-way (the bf16 step on the reference's inputs)."""
    code, stdout, _ = cli(["check", MODEL, "--dtype", "bfloat16", "--prompt", PROMPT, "--chunk", "5",
                           "--decode", "2", *SUBSET, "--fault", D.DECODE_ENGRAM_WINDOW_RESET,
                           "--json", tmp_path / "r.json"], capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert code == 1 and rep["earliest"] == ["logits.step.2"], rep["earliest"]
    num = {b["name"]: b for b in rep["numeric"]["boundaries"]}
    assert num["logits.step.2"]["status"] in ("match", "cascade"), num["logits.step.2"]
    step = next(t for t in num["logits.step.2"]["tensors"] if t["name"] == "logits.step.2")
    assert step["metrics"]["family"]["of"] == "logits", step["metrics"]
    local = rep.get("local_error_numeric")
    if local is not None:  # a prefill flip's cascade: its decode stages judged three-way
        steps = {b["boundary"]: b for b in local["boundaries"] if b["boundary"].startswith("logits.step.")}
        assert steps and all("three-way" in b["reason"] for b in steps.values()), steps


def test_direct_keeps_the_one_comparison(tmp_path, capsys):
    code, stdout, _ = cli(["check", MODEL, "--dtype", "bfloat16", "--passes", "direct", "--prompt", PROMPT,
                           *SUBSET, "--json", tmp_path / "r.json"], capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["passes"] == ["direct"] and rep["numeric"] is None and "== numeric pass" not in stdout
    assert code == (0 if rep["passed"] else 1)


@pytest.mark.parametrize("fault", [None, D.ROUTER_BIASED_WEIGHTS])
def test_a_layer_subset_is_judged_by_local_error_behind_a_flip(jpeg, tmp_path, capsys, fault):
    """bf16 against fp32, direct, layers 0-2: router.0.ids flips on a near-tie, so router.0.weights
    after it is the flip's cascade end to end; local error runs on the subset's stages and names
    the planted weights bug there, and finds the clean subset within tolerance."""
    args = ["check", MODEL, "--image", jpeg, "--prompt", PROMPT, "--chunk", "64", "--dtype", "bfloat16",
            "--oracle-dtype", "float32", *SUBSET, "--json", tmp_path / "r.json"]
    code, stdout, _ = cli(args + (["--fault", fault] if fault else []), capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    status = {b["name"]: b["status"] for b in rep["boundaries"]}
    assert status["router.0.ids"] == "benign" and "cascade" in status.values(), status
    assert rep["local_error"]["available"]
    if fault is None:
        assert code == 0 and rep["local_error"]["origin"] is None, stdout[-2000:]
    else:  # end to end the bug hides in the flip's cascade; its own stage names it
        assert status["router.0.weights"] == "cascade", status
        assert code == 1 and rep["local_error"]["origin"] == "router.0.weights", rep["local_error"]["summary"]
