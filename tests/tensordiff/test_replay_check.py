"""Decode steps a captured CUDA graph froze: bit-identical from step to step in two or more layers,
said by `compare` and `inspect` (tensordiff/judge/replay_check.py)."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from tensordiff import Recorder
from tensordiff.format.dump import open_dump
from tensordiff.format.plain import open_any
from tensordiff.judge.replay_check import family, frozen_families, layer_of, note
from tests.cli_runner import run_cli

LAYERS, STEPS = 3, 3


def decode(rng, frozen_layers=(), constant=False):
    """{name: array}: a prompt and STEPS decode steps of a per-layer tensor; in `frozen_layers`
    every decode step holds the last step's values (what a graph replaying one buffer leaves)."""
    out = {}
    for layer in range(LAYERS):
        out[f"model.layers.{layer}.mlp.output"] = rng.standard_normal((4, 8)).astype(np.float32)
        steps = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(STEPS)]
        for k in range(1, STEPS + 1):
            out[f"model.layers.{layer}.mlp.output.step.{k}"] = steps[-1] if layer in frozen_layers else steps[k - 1]
    for k in range(1, STEPS + 1):  # one request's pool slot: the same every step, in no layer
        out[f"req_pool_indices.step.{k}"] = np.array([3], np.int64) if constant else np.array([k], np.int64)
    return out


def recorded(path, tensors, model="m"):
    with Recorder(path, model=model) as rec:
        for name, a in tensors.items():
            rec.record(name, a)
    return path


def test_decode_step_names_families_and_layers():
    assert family("model.layers.3.mlp.output.step.2") == ("model.layers.3.mlp.output", 2)
    assert family("token.step.4.ids") == ("token.ids", 4)
    assert family("logits") is None and family("x.step.0") is None and family("x.step.b") is None
    assert layer_of("model.layers.3.mlp.output") == 3 and layer_of("hidden.12") == 12
    assert layer_of("mlp_up.layer_id.0") == 0 and layer_of("logits") is None and layer_of("v1.x") is None


@pytest.mark.parametrize("frozen_layers,constant,said", [
    ((0, 1, 2), True, True),    # the graph signature: every layer's decode frozen
    ((0, 2), False, True),      # two layers are enough
    ((1,), True, False),        # one layer's tensor, and a constant with no layer: not the signature
    ((), True, False),          # real decode: the steps differ
])
def test_the_note_fires_on_steps_frozen_in_two_layers_and_only_then(tmp_path, frozen_layers, constant, said):
    d = open_dump(recorded(tmp_path / "d", decode(np.random.default_rng(0), frozen_layers, constant)))
    got = note(d)
    assert (got is not None) == said, got
    if said:
        assert set(frozen_families(d)) == {f"model.layers.{i}.mlp.output" for i in frozen_layers}
        assert "bit-identical from step to step" in got and "--disable-cuda-graph" in got and str(d.path) in got


def test_compare_and_inspect_say_it(tmp_path, capsys):
    rng = np.random.default_rng(1)
    clean = decode(rng)
    frozen = dict(clean)
    for layer in range(LAYERS):  # every step holds the last replay's values
        for k in range(1, STEPS):
            frozen[f"model.layers.{layer}.mlp.output.step.{k}"] = clean[f"model.layers.{layer}.mlp.output.step.{STEPS}"]
    a, b = recorded(tmp_path / "a", clean), recorded(tmp_path / "b", frozen)
    code, out, err = run_cli(["compare", a, b, "--json", tmp_path / "r.json"], capsys)
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert code == 1 and [n for n in notes if "bit-identical" in n] == [note(open_dump(b))]
    assert str(b) in [n for n in notes if "bit-identical" in n][0] and "bit-identical" in out
    code, out, err = run_cli(["compare", a, recorded(tmp_path / "c", clean)], capsys)
    assert code == 0 and "bit-identical" not in out
    code, out, err = run_cli(["inspect", b], capsys)
    assert code == 0 and "note: " in out and "bit-identical from step to step" in out
    code, out, err = run_cli(["inspect", a], capsys)
    assert code == 0 and "bit-identical" not in out


def test_inspect_reads_no_tensor_without_verify(tmp_path, capsys):
    # plain safetensors carry no sha256: the steps are judged only when --verify reads them
    frozen = decode(np.random.default_rng(2), frozen_layers=(0, 1, 2))
    (tmp_path / "plain").mkdir()
    save_file(frozen, str(tmp_path / "plain" / "t.safetensors"))
    assert note(open_any(tmp_path / "plain"), read=False) is None
    code, out, _ = run_cli(["inspect", tmp_path / "plain"], capsys)
    assert code == 0 and "bit-identical" not in out
    code, out, err = run_cli(["inspect", tmp_path / "plain", "--verify"], capsys)
    # the steps are read and the note given; no digest was there to verify, which is exit 2
    assert code == 2 and "bit-identical from step to step" in out and "nothing was verified" in err


def test_a_sharded_dump_is_judged_from_its_ranks_digests(tmp_path):
    frozen = decode(np.random.default_rng(3), frozen_layers=(0, 1))
    for r in range(2):
        with Recorder(tmp_path / "e" / f"rank{r}", model="m", run={"parallel": {"rank": r, "world": 2}}) as rec:
            for name, a in frozen.items():
                rec.record(name, a, layout={"replicated": True})
    d = open_dump(tmp_path / "e")
    assert d.world == 2 and d.entries[0].sha256 is None  # merged: no one digest in a manifest
    assert note(d, read=False) is not None and set(frozen_families(d, read=False)) == {
        "model.layers.0.mlp.output", "model.layers.1.mlp.output"}
