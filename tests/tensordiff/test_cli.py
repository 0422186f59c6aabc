import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_dumps import pipeline, write

from tensordiff.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "dumps"


def run(args, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_samples_diverge_at_rope(capsys, tmp_path):
    code, out, err = run(["compare", SAMPLES / "sample-oracle", SAMPLES / "sample-engine", "--json", tmp_path / "r.json"], capsys)
    assert code == 1 and out.startswith("DIVERGED: earliest divergence at `rope`")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["verdict"] == "diverged" and rep["earliest"] == ["rope"]
    b = {x["name"]: x for x in rep["boundaries"]}
    assert b["patches"]["status"] == "match" and b["block0"]["status"] == "consequent"
    assert {"name", "status", "metrics", "tolerance"} <= set(b["rope"])


def test_match_exits_zero(capsys, tmp_path):
    a, b = write(tmp_path / "a", pipeline()), write(tmp_path / "b", pipeline())
    code, out, _ = run(["compare", a, b], capsys)
    assert code == 0 and out.startswith("MATCH")


@pytest.mark.parametrize("args,match", [
    (["compare", "nope", "nope2"], "does not exist"),
    (["compare", SAMPLES / "sample-oracle", SAMPLES / "sample-oracle"], "twice"),
    (["compare", SAMPLES / "sample-oracle"], "usage error"),
    (["compare", SAMPLES / "sample-oracle", SAMPLES / "sample-engine", "--json", "/nonexistent/dir/r.json"], "does not exist"),
    (["compare", SAMPLES / "sample-oracle", SAMPLES / "sample-engine", "--tolerances", "/nope.toml"], "does not exist"),
    (["inspect", "nope"], "does not exist"),
    (["bogus-command"], "usage error"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, match):
    code, out, err = run(args, capsys)
    assert code == 2
    assert match in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_pickle_offered_as_a_dump(capsys, tmp_path):
    pt = tmp_path / "model.pt"
    torch.save({"x": torch.ones(1)}, pt)
    code, _, err = run(["compare", pt, SAMPLES / "sample-oracle"], capsys)
    assert code == 2 and "never unpickles" in err


def test_unwritable_output(capsys, tmp_path):
    if os.geteuid() == 0:
        target = tmp_path / "adir"
        target.mkdir()  # a directory cannot be written as a file, even by root
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "r.json"
    code, _, err = run(["compare", SAMPLES / "sample-oracle", SAMPLES / "sample-engine", "--json", target], capsys)
    assert code == 2 and "cannot write" in err


def test_inspect_lists_tensors(capsys):
    code, out, _ = run(["inspect", SAMPLES / "sample-oracle", "--verify"], capsys)
    assert code == 0 and "rope.cos" in out and "sha256 ok" in out and "SHA256 MISMATCH" not in out


def test_console_script_and_pipe_output():
    p = subprocess.run([sys.executable, "-m", "tensordiff.cli", "compare", str(SAMPLES / "sample-oracle"),
                        str(SAMPLES / "sample-engine")], capture_output=True, text=True)
    assert p.returncode == 1 and "earliest divergence at `rope`" in p.stdout and "\x1b[" not in p.stdout


def test_help_teaches():
    p = subprocess.run([sys.executable, "-m", "tensordiff.cli", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "EARLIEST" in p.stdout and "compare" in p.stdout
