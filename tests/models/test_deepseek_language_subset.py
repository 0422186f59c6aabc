"""A layer subset of the DeepSeek language backbone (`--layers`): both sides run only those
layers on the same prompt, read only their tensors, agree, still catch a planted fault, and
refuse a subset that leaves out a layer another one reads from."""
from __future__ import annotations

import json
import shutil

import pytest

from cli_runner import run_cli as cli
from tensordiff.format.dump import open_dump
import tensordiff.models.deepseek_v41_flash.faults as D
from tensordiff.models.deepseek_v41_flash.synthetic import resolve

MODEL = "deepseek-v4.1-flash"
PROMPT = "Look at <image> and say what it shows."
# the fp32 semantic language numerics, where the two routes agree boundary by boundary (the
# official bf16 + kernel rounding may flip a pick without a bug: README, "official numerics")
SEMANTIC = "language_numerics=semantic"




@pytest.fixture(scope="module")
def without_layers_0_1(module_tmp):
    """synthetic:tiny whose layers 0 and 1 point to a shard that does not exist: a run that
    touched any of their tensors would fail."""
    src, dst = resolve("synthetic:tiny"), module_tmp("subset") / "ckpt"
    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for name in index["weight_map"]:
        if name.startswith(("layers.0.", "layers.1.")):
            index["weight_map"][name] = "absent-00001.safetensors"
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_subset_runs_only_its_layers_and_matches(without_layers_0_1, tmp_path, capsys):
    out = tmp_path / "dumps"
    code, _, err = cli(["check", MODEL, "--weights", without_layers_0_1, "--prompt", PROMPT, "--decode", "2",
                        "--layers", "2-5", "--out", out, "--no-cache", "-o", SEMANTIC], capsys)
    assert code == 0, err
    for side in ("oracle", "engine"):
        d = open_dump(out / side)
        assert d.run["layers"] == [2, 3, 4, 5]
        names = set(d.names)
        assert "hidden.2" in names and "hidden.5" in names and "logits.step.2" in names
        assert not {"hidden.0", "hidden.1", "engram.1.gate"} & names


def test_the_whole_stack_needs_the_left_out_layers(without_layers_0_1, tmp_path, capsys):
    """The control: without --layers the same checkpoint fails (exit 2), so the subset run above
    really did not read layers 0 and 1."""
    code, _, err = cli(["check", MODEL, "--weights", without_layers_0_1, "--prompt", PROMPT, "--no-cache"], capsys)
    assert code == 2 and "absent-00001.safetensors" in err, err


def test_planted_fault_is_caught_inside_the_subset(without_layers_0_1, capsys):
    code, out, err = cli(["check", MODEL, "--weights", without_layers_0_1, "--prompt", PROMPT, "--layers", "2-5",
                          "--fault", D.ROUTER_BIASED_WEIGHTS, "-o", SEMANTIC], capsys)
    assert code == 1, err
    assert "router.2.weights" in out


@pytest.mark.parametrize("spec,says", [("3", "layer 3 reads its compressed KV"),
                                       ("2-3,5", "layer 5"), ("4-9", "not"), ("two", "0-2")])
@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_open_or_malformed_subsets_exit_2(side, spec, says, tmp_path, capsys):
    code, _, err = cli(["dump", MODEL, "--side", side, "--prompt", PROMPT, "--layers", spec,
                        "--out", tmp_path / "out"], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_layers_is_refused_for_qwen(capsys):
    code, _, err = cli(["check", "qwen3-vl", "--layers", "0-2"], capsys)
    assert code == 2 and "--layers" in err


def test_gate_takes_a_layer_subset(without_layers_0_1, tmp_path, capsys):
    gate = tmp_path / "gate.toml"
    gate.write_text(f'[[model]]\nname = "{MODEL}"\nweights = "{without_layers_0_1}"\nprompts = ["{PROMPT}"]\n'
                    'layers = "2-5"\noptions = { language_numerics = "semantic" }\n')
    code, out, err = cli(["gate", gate, "--no-cache"], capsys)
    assert code == 0, out + err
    code, out, err = cli(["gate", gate, "--no-cache", "--fault", D.ROUTER_BIASED_WEIGHTS], capsys)
    assert code == 1, out + err
