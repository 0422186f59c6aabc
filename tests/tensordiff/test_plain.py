"""Plain safetensors files (and folders of them) compare with no manifest."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.errors import BadInput
from tensordiff.format.plain import PRODUCER, open_any
from tests.cli_runner import run_cli


def tensors(scale=1.0, seed=0):
    g = np.random.default_rng(seed)
    return {"embed": g.standard_normal((4, 8)).astype(np.float32),
            "block": g.standard_normal((4, 8)).astype(np.float32) * scale,
            "ids": np.arange(4, dtype=np.int64)}


def test_a_plain_file_is_a_dump_in_file_order(tmp_path):
    save_file(tensors(), str(tmp_path / "a.safetensors"))
    d = open_any(tmp_path / "a.safetensors")
    assert d.producer["name"] == PRODUCER and d.model == "plain"
    # the safetensors writer orders by dtype, then name: the header (= data) order is the order
    assert d.names == ["ids", "block", "embed"]
    assert [e.boundary for e in d.entries] == d.names  # each key is its own boundary


def test_a_folder_orders_files_by_name_with_numbers_as_numbers(tmp_path):
    for i in (10, 2, 1):
        save_file({f"layer{i}": np.zeros(2, np.float32)}, str(tmp_path / f"part{i}.safetensors"))
    assert open_any(tmp_path).names == ["layer1", "layer2", "layer10"]


def test_clean_pair_matches_and_a_planted_change_is_named(tmp_path, capsys):
    save_file(tensors(), str(tmp_path / "a.safetensors"))
    save_file(tensors(), str(tmp_path / "b.safetensors"))
    bad = tensors()
    bad["embed"][2, 3] += 1.0  # the planted fault
    save_file(bad, str(tmp_path / "c.safetensors"))
    assert compare_dumps(tmp_path / "a.safetensors", tmp_path / "b.safetensors").verdict == "match"
    code, out, err = run_cli(["compare", tmp_path / "a.safetensors", tmp_path / "c.safetensors",
                              "--json", tmp_path / "r.json"], capsys)
    assert code == 1, err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["earliest"] == ["embed"] and r["producers"]["a"]["name"] == PRODUCER


def test_a_folder_against_a_file(tmp_path, capsys):
    (tmp_path / "ref").mkdir()
    t = tensors()
    save_file({"embed": t["embed"]}, str(tmp_path / "ref" / "0.safetensors"))
    save_file({"block": t["block"], "ids": t["ids"]}, str(tmp_path / "ref" / "1.safetensors"))
    save_file(t, str(tmp_path / "b.safetensors"))
    code, out, err = run_cli(["compare", tmp_path / "ref", tmp_path / "b.safetensors"], capsys)
    assert code == 0, out + err


@pytest.mark.parametrize("case,msg", [
    ("dup", "is also in"),
    ("badkey", "is not usable as a name"),
    ("notst", "is not valid|not a tensordiff dump|no manifest"),
])
def test_bad_plain_input_is_one_line_exit_2(tmp_path, capsys, case, msg):
    a = tmp_path / "a"
    a.mkdir()
    if case == "dup":
        save_file({"x": np.zeros(1, np.float32)}, str(a / "0.safetensors"))
        save_file({"x": np.zeros(1, np.float32)}, str(a / "1.safetensors"))
    elif case == "badkey":
        save_file({"model/x": np.zeros(1, np.float32)}, str(a / "0.safetensors"))
    else:
        (a / "notes.txt").write_text("hello")
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "b.safetensors"))
    code, out, err = run_cli(["compare", a, tmp_path / "b.safetensors"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    import re
    assert re.search(msg, err), err


def test_a_corrupt_file_is_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(BadInput, match="corrupt|truncated"):
        open_any(tmp_path / "a.safetensors")


def test_a_plain_file_against_a_named_models_dump_takes_its_contract(tmp_path):
    from tensordiff import Recorder

    g = np.random.default_rng(1)
    t = {"patches": g.standard_normal((4, 6)).astype(np.float32),
         "rope.cos": g.standard_normal((4, 2)).astype(np.float32),
         "rope.sin": g.standard_normal((4, 2)).astype(np.float32)}
    with Recorder(tmp_path / "oracle", model="qwen3-vl") as rec:
        for k, v in t.items():
            rec.record(k, v)
    save_file(t, str(tmp_path / "engine.safetensors"))
    r = compare_dumps(tmp_path / "oracle", tmp_path / "engine.safetensors")
    assert r.verdict == "match" and r.model == "qwen3-vl"
    assert [b.name for b in r.boundaries] == ["patches", "rope"]  # rope.cos and rope.sin: one boundary
    t["rope.sin"] = t["rope.sin"][::-1].copy()  # the planted fault
    save_file(t, str(tmp_path / "bad.safetensors"))
    assert compare_dumps(tmp_path / "oracle", tmp_path / "bad.safetensors").earliest == ["rope"]
