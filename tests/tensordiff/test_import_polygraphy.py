"""`tensordiff import polygraphy`: Polygraphy's saved outputs/inputs, round trip, no pickle.

The samples in tests/data/import/polygraphy/ were written by Polygraphy 0.53.6 itself
(make_polygraphy_samples.py: `polygraphy run tiny.onnx --onnxrt`, its Comparator and
RunResults.save); these tests need neither polygraphy nor onnxruntime."""
import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tensordiff.format.dump import open_dump
from tensordiff.format.importers.polygraphy import read
from tests.cli_runner import run_cli

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "import" / "polygraphy"


def decode(entry):
    """Our own reading of one saved array, independent of the importer."""
    return np.load(io.BytesIO(base64.b64decode(entry["values"]["array"])), allow_pickle=False)


def test_round_trip_outputs_exactly_in_order(tmp_path, capsys):
    code, out, err = run_cli(["import", "polygraphy", SAMPLES / "outputs.json", "--out", tmp_path / "d"], capsys)
    assert code in (0, None), err
    d = open_dump(tmp_path / "d")
    raw = json.loads((SAMPLES / "outputs.json").read_text())["lst"][0][1][0]["outputs"]
    assert d.names == ["proj.MatMul_output_0", "proj.Add_output_0", "hidden", "probs", "probs_fp16", "ids"]
    assert d.run["import"]["renamed"]["proj.MatMul_output_0"] == "/proj/MatMul_output_0"
    for name, orig in zip(d.names, raw):
        want = decode(raw[orig])
        got = d.load(name)
        assert d.entry(name).dtype.name == str(want.dtype) and np.array_equal(got, want.astype(got.dtype))
    assert d.entry("probs_fp16").dtype.name == "float16" and d.entry("ids").dtype.name == "int64"


def test_saved_inputs_import_too():
    imp = read(SAMPLES / "inputs.json")
    assert [n for _, n, *_ in imp.tensors] == ["x"] and imp.tensors[0][2].shape == (2, 3, 4)


def test_runners_and_iterations_are_picked_explicitly(tmp_path, capsys):
    f = SAMPLES / "two_runners.json"
    code, out, err = run_cli(["import", "polygraphy", f, "--out", tmp_path / "a"], capsys)
    assert code == 2 and "2 runners (ort-a, ort-b); pick one with --runner" in err
    code, out, err = run_cli(["import", "polygraphy", f, "--runner", "ort-a", "--out", tmp_path / "a"], capsys)
    assert code == 2 and "2 iterations; pick one with --iteration" in err
    for r in ("ort-a", "ort-b"):
        assert run_cli(["import", "polygraphy", f, "--runner", r, "--iteration", "1", "--out", tmp_path / r],
                       capsys)[0] in (0, None)
    # the two runners ran one graph on one input: the comparison is a clean case
    assert run_cli(["compare", tmp_path / "ort-a", tmp_path / "ort-b"], capsys)[0] == 0
    code, out, err = run_cli(["import", "polygraphy", f, "--runner", "ort-c", "--out", tmp_path / "c"], capsys)
    assert code == 2 and "no runner 'ort-c'" in err


def test_a_planted_change_is_named(tmp_path, capsys):
    data = json.loads((SAMPLES / "outputs.json").read_text())
    out = data["lst"][0][1][0]["outputs"]
    arr = decode(out["/proj/Add_output_0"]).copy()
    arr[1, 2, 3] += 1.0
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    out["/proj/Add_output_0"]["values"]["array"] = base64.b64encode(buf.getvalue()).decode()
    (tmp_path / "bad.json").write_text(json.dumps(data))
    for src, o in ((SAMPLES / "outputs.json", "a"), (tmp_path / "bad.json", "b")):
        assert run_cli(["import", "polygraphy", src, "--out", tmp_path / o], capsys)[0] in (0, None)
    code, _, _ = run_cli(["compare", tmp_path / "a", tmp_path / "b", "--json", tmp_path / "r.json"], capsys)
    assert code == 1 and json.loads((tmp_path / "r.json").read_text())["earliest"] == ["proj.Add_output_0"]


def test_a_torch_tensor_is_refused_never_unpickled(tmp_path, capsys, monkeypatch):
    import pickle

    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("unpickled"))
    code, out, err = run_cli(["import", "polygraphy", SAMPLES / "torch.json", "--out", tmp_path / "d"], capsys)
    assert code == 2 and "torch.save (a pickle)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def _npy(arr, allow_pickle=False):
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=allow_pickle)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("payload,msg", [
    ({"lst": "x", "polygraphy_class": "RunResults"}, "neither Polygraphy RunResults"),
    ({"foo": 1}, "neither Polygraphy RunResults"),
    ({"lst": [["r", [{"outputs": {"a": {"array": "@@@", "polygraphy_class": "ndarray"}}}]]],
      "polygraphy_class": "RunResults"}, "not a valid .npy payload"),
    ({"lst": [["r", [{"outputs": {"a": {"polygraphy_class": "ndarray",
                                         "array": _npy(np.array([{"x": 1}], dtype=object), True)}}}]]],
      "polygraphy_class": "RunResults"}, "cannot be read without pickle"),
    ({"lst": [["r", [{"outputs": {"a": {"array": "\u039c", "polygraphy_class": "ndarray"}}}]]],
      "polygraphy_class": "RunResults"}, "neither base64 nor latin-1"),  # fuzz finding: UnicodeEncodeError
    ({"lst": [["r", [{"outputs": {"a": {"polygraphy_class": "ndarray", "array": base64.b64encode(
        b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (2,\n" + b" " * 8).decode()}}}]]],
      "polygraphy_class": "RunResults"}, "not a valid .npy payload"),  # fuzz finding: tokenize.TokenError
    ({"lst": [["r", [{"outputs": {}}]]], "polygraphy_class": "RunResults"}, "no tensors to import"),
    ({"lst": [["r", [{"outputs": {"a/b": {"polygraphy_class": "ndarray", "array": _npy(np.zeros(1))},
                                  "a.b": {"polygraphy_class": "ndarray", "array": _npy(np.zeros(1))}}}]]],
      "polygraphy_class": "RunResults"}, "both become 'a.b'"),
])
def test_bad_files_are_one_line_exit_2(tmp_path, capsys, payload, msg):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(payload))
    code, out, err = run_cli(["import", "polygraphy", f, "--out", tmp_path / "d"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and msg in err, err


def test_legacy_markers_are_read(tmp_path):
    shutil.copy(SAMPLES / "outputs.json", tmp_path / "o.json")
    text = (tmp_path / "o.json").read_text()
    for cls in ("ndarray", "LazyArray", "IterationResult", "RunResults"):
        text = text.replace(f'"polygraphy_class": "{cls}"',
                            f'"__polygraphy_encoded_{cls}": "polygraphy_serialized_json_type"')
    (tmp_path / "o.json").write_text(text)
    assert len(read(tmp_path / "o.json").tensors) == 6
