"""The gate: config parsing and validation, runs on the toy adapter, CLI exit codes and outputs."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from tensordiff.errors import BadInput
from tensordiff.commands.gate import load_gate, run_gate

import test_gate_toy as toy


@pytest.fixture(autouse=True)
def _toys(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)


def _png(path: Path, size=(90, 60), color=(200, 30, 30)) -> Path:
    Image.new("RGB", size, color).save(path)
    return path


def _run_cli(argv, capsys):
    from tensordiff.commands.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


# ----------------------------------------------------------------------------- config

def test_minimal_config_takes_defaults(tmp_path):
    cfg = load_gate(toy.write_gate(tmp_path))
    (m,) = cfg.models
    assert cfg.name == "toy gate"
    assert (m.name, m.weights, m.dtype, m.device, m.backend, m.local_error) == \
        (toy.NAME, "synthetic:tiny", "float32", "cpu", "torch", True)
    assert len(m.images) == 1 and m.images[0].name == "default.png"


def test_gate_keys_are_defaults_and_model_keys_win(tmp_path):
    _png(tmp_path / "a.png")
    p = tmp_path / "g.toml"
    p.write_text('[gate]\nimages = ["a.png"]\ndtype = "bfloat16"\nlocal_error = false\n\n'
                 f'[[model]]\nname = "{toy.NAME}"\n\n[[model]]\nname = "{toy.NAME}"\ndtype = "float32"\n'
                 'images = ["tensordiff:default", "a.png"]\nprompts = ["describe <image>"]\n')
    a, b = load_gate(p).models
    assert a.dtype == "bfloat16" and b.dtype == "float32"
    assert not a.local_error and not b.local_error
    assert [i.name for i in a.images] == ["a.png"]
    assert [i.name for i in b.images] == ["default.png", "a.png"]
    assert b.prompts == ("describe <image>",)


def test_options_table_becomes_the_cases_option_assignments(tmp_path):
    (m,) = load_gate(toy.write_gate(tmp_path, 'options = { mode = "x", flag = true, n = 3 }\n')).models
    assert m.options == ("mode=x", "flag=true", "n=3")
    (m,) = load_gate(toy.write_gate(tmp_path)).models
    assert m.options == ()


def test_image_folder_expands_to_its_images_in_name_order(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    _png(d / "b.png")
    _png(d / "a.jpg")
    (d / "notes.txt").write_text("not an image")
    cfg = load_gate(toy.write_gate(tmp_path, 'images = ["imgs"]\n'))
    assert [i.name for i in cfg.models[0].images] == ["a.jpg", "b.png"]


@pytest.mark.parametrize("body, needle", [
    ('colour = "red"\n', "unknown key 'colour'"),
    ('dtype = "float64"\n', "dtype must be float32 or bfloat16"),
    ('images = []\n', "images must be a non-empty list"),
    ('images = ["nope.png"]\n', "does not exist"),
    ('images = ["empty"]\n', "holds no image files"),
    ('images = ["bad.png"]\n', "corrupt"),
    ('weights = "/no/such/dir"\n', "neither synthetic"),
    ('tolerances = "tol.toml"\n', "unknown tolerance table"),
    ('chunk = 0\n', "chunk must be a positive integer"),
    ('local_error = "yes"\n', "local_error must be true or false"),
    ('options = "fast"\n', "options must be a table of run options"),
])
def test_bad_model_table_is_one_clear_error(tmp_path, body, needle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    (tmp_path / "tol.toml").write_text("[tolerances.float99]\natol = 1\n")
    with pytest.raises(BadInput) as e:
        load_gate(toy.write_gate(tmp_path, body))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("body, needle", [
    ('images = [["tensordiff:default", "tensordiff:default"]]\nprompts = ["<image> <image>"]\n',
     "takes one image per prompt"),  # the toy's runners take one image
    ('images = [["a.png", "imgs"]]\n', "is a folder"),
    ('images = [["a.png", "missing.png"]]\n', "does not exist"),
    ('images = [["a.png"]]\n', "lists of image files"),  # one image is a file, not a list
])
def test_a_case_of_several_images_is_checked_when_the_file_is_read(tmp_path, body, needle):
    _png(tmp_path / "a.png")
    (tmp_path / "imgs").mkdir()
    with pytest.raises(BadInput, match=needle) as e:
        load_gate(toy.write_gate(tmp_path, body))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, needle", [
    ("[gate]\nname = 'x'\n", "needs at least one [[model]]"),
    ("[[model]]\nweights = 'synthetic:tiny'\n", "needs name ="),
    ("[[model]]\nname = 'gpt-17'\n", "unknown model 'gpt-17'"),
    ("[gate]\nspeed = 'fast'\n[[model]]\nname = 'toy-vision'\n", "unknown key 'speed'"),
    ("[runs]\nx = 1\n[[model]]\nname = 'toy-vision'\n", "unknown table 'runs'"),
    ("[[model]\nname = 'x'\n", "not valid TOML"),
])
def test_bad_gate_file_is_one_clear_error(tmp_path, text, needle):
    p = tmp_path / "g.toml"
    p.write_text(text)
    with pytest.raises(BadInput) as e:
        load_gate(p)
    assert needle in str(e.value)


def test_missing_config_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load_gate(tmp_path / "nope.toml")


# ----------------------------------------------------------------------------- runs

def test_clean_engine_passes_with_a_timing_breakdown(tmp_path):
    res = run_gate(load_gate(toy.write_gate(tmp_path)), progress=False, echo=lambda s: None)
    (c,) = res.cases
    assert res.passed and res.exit_code == 0
    assert c.report.verdict == "match" and c.local.origin is None
    assert {"weights", "oracle", "engine", "compare", "local_error"} <= set(c.timings)
    assert all(v >= 0 for v in c.timings.values())
    b = res.breakdown()
    assert {"setup", "weights", "oracle", "engine", "compare", "local_error", "report", "total"} <= set(b)
    assert "PASS" in c.summary_line()


@pytest.mark.parametrize("fault", [f.name for f in toy.FAULTS if f.name != "oracle-like-drift"])
def test_every_fault_fails_the_gate(tmp_path, fault):
    res = run_gate(load_gate(toy.write_gate(tmp_path)), fault=fault, progress=False, echo=lambda s: None)
    (c,) = res.cases
    assert res.exit_code == 1
    assert c.local.origin == toy.ADAPTER.fault(fault).boundary
    assert c.summary_line().startswith("FAIL")


def test_oracle_is_cached_across_cases_and_runs(tmp_path):
    cfg = load_gate(toy.write_gate(tmp_path))
    first = run_gate(cfg, progress=False, echo=lambda s: None)
    second = run_gate(cfg, fault="rope-flip", progress=False, echo=lambda s: None)
    assert not first.cases[0].oracle_cached and second.cases[0].oracle_cached
    third = run_gate(cfg, use_cache=False, progress=False, echo=lambda s: None)
    assert not third.cases[0].oracle_cached


def test_a_fault_no_model_has_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no model in this gate has a fault 'warp-drive'"):
        run_gate(load_gate(toy.write_gate(tmp_path)), fault="warp-drive", progress=False)


def test_out_keeps_each_case_dumps(tmp_path):
    res = run_gate(load_gate(toy.write_gate(tmp_path)), out=tmp_path / "out", progress=False, echo=lambda s: None)
    case_dir = tmp_path / "out" / "case-000"
    assert (case_dir / "oracle" / "manifest.json").is_file()
    assert (case_dir / "engine" / "manifest.json").is_file()
    assert (case_dir / "local" / "manifest.json").is_file()
    assert res.passed


# ----------------------------------------------------------------------------- CLI

def test_cli_gate_pass_writes_json_junit_html(tmp_path, capsys):
    cfg = toy.write_gate(tmp_path)
    rc, out, err = _run_cli(["gate", str(cfg), "--json", str(tmp_path / "g.json"), "--junit",
                             str(tmp_path / "g.xml"), "--html", str(tmp_path / "g.html")], capsys)
    assert rc == 0, out + err
    assert "PASS" in out and "GATE PASS" in out and "time per stage" in out
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["passed"] is True
    assert {"weights", "oracle", "engine", "compare", "report", "total"} <= set(data["timings"])
    assert data["cases"][0]["verdict"] == "match"
    root = ET.parse(tmp_path / "g.xml").getroot()
    assert root.tag == "testsuites" and root.get("failures") == "0"
    assert len(root.findall(".//testcase")) == 5
    html = (tmp_path / "g.html").read_text()
    assert "data:image/jpeg;base64," in html and "PASS" in html


def test_cli_gate_fault_exits_1_and_junit_names_the_boundary(tmp_path, capsys):
    cfg = toy.write_gate(tmp_path)
    rc, out, err = _run_cli(["gate", str(cfg), "--fault", "rope-flip", "--junit", str(tmp_path / "g.xml")], capsys)
    assert rc == 1
    assert "GATE FAIL" in out and "earliest divergence at `rope`" in out
    root = ET.parse(tmp_path / "g.xml").getroot()
    failed = {tc.get("name"): tc.find("failure").get("type") for tc in root.iter("testcase")
              if tc.find("failure") is not None}
    assert failed["rope"] == "root"
    assert set(failed) == {"rope", "block0", "final_norm", "aligner"}


@pytest.mark.parametrize("argv, needle", [
    (["gate", "NOPE.toml"], "does not exist"),
    (["gate", "{cfg}", "--fault", "nope"], "no model in this gate has a fault"),
    (["gate", "{cfg}", "--model", "other"], "--model 'other' is not in"),
    (["gate", "{cfg}", "--weights", "/no/where"], "neither synthetic"),
    (["gate", "{cfg}", "--device", "tpu"], "unknown device"),
    (["gate", "{cfg}", "--junit", "/no/such/dir/g.xml"], "does not exist"),
])
def test_cli_gate_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    cfg = toy.write_gate(tmp_path)
    argv = [a.replace("{cfg}", str(cfg)) for a in argv]
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_compare_writes_junit_and_html(tmp_path, capsys):
    root = Path(__file__).resolve().parents[2] / "dumps"
    rc, out, err = _run_cli(["compare", str(root / "sample-oracle"), str(root / "sample-engine"),
                             "--junit", str(tmp_path / "c.xml"), "--html", str(tmp_path / "c.html")], capsys)
    assert rc == 1
    suite = ET.parse(tmp_path / "c.xml").getroot().find("testsuite")
    assert suite.get("tests") == "5" and suite.get("failures") == "4"
    assert (tmp_path / "c.html").read_text().count("<figure>") == 6


# ----------------------------------------------------------------------------- faults and their routes

def _toy_with_a_language_fault(monkeypatch):
    """The toy, whose aligner fault now says it needs the language route (a prompt)."""
    import dataclasses

    from tensordiff.pipeline.faults import LANGUAGE

    faults = tuple(dataclasses.replace(f, needs=(LANGUAGE,)) if f.name == "aligner-bias" else f for f in toy.FAULTS)
    monkeypatch.setitem(toy.TOYS, toy.NAME, dataclasses.replace(toy.ADAPTER, faults=faults))


def test_a_fault_no_case_can_carry_is_bad_input(tmp_path, monkeypatch):
    _toy_with_a_language_fault(monkeypatch)
    with pytest.raises(BadInput, match="no case of this gate can carry it: fault 'aligner-bias' needs --prompt"):
        run_gate(load_gate(toy.write_gate(tmp_path)), fault="aligner-bias", progress=False, echo=lambda s: None)


def test_a_fault_is_planted_in_the_cases_that_take_its_route(tmp_path, monkeypatch):
    _toy_with_a_language_fault(monkeypatch)
    cfg = load_gate(toy.write_gate(tmp_path, 'prompts = ["describe <image>"]\n'))
    res = run_gate(cfg, fault="aligner-bias", progress=False, echo=lambda s: None)
    assert res.exit_code == 1 and res.cases[0].report.earliest == ["aligner"]
    assert "fault aligner-bias" in res.cases[0].label
