import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_dumps import pipeline, write

from cli_runner import run_cli as run

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "dumps"




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


def test_inspect_speaks_plain_words(capsys, tmp_path):
    """No Python reprs: nested run facts one per line under dotted keys, None as `none`, booleans
    as yes/no, lists as `a, b`, shapes as `a × b`."""
    run_facts = {"inputs": {"grid": [6, 9], "image": {"exif_orientation": None, "size": [1024, 701]}},
                 "options": {"processor": None, "kernel_quant": False}, "chunk": None, "tokens": list(range(40))}
    d = write(tmp_path / "d", {"patches": torch.zeros(6, 9), "scalar": torch.tensor(1.0)}, run=run_facts)
    code, out, _ = run(["inspect", d], capsys)
    assert code == 0
    for repr_mark in ("{'", "None", "True", "False", "[6", "'"):
        assert repr_mark not in out, repr_mark
    facts = {}
    for line in out.splitlines()[1:]:
        if not line.startswith("  "):
            break
        key, _, value = line.strip().partition("  ")
        facts[key] = value.strip()
    assert facts["producer.name"] == "test" and facts["model"] == "toy"
    assert facts["run.inputs.grid"] == "6, 9" and facts["run.inputs.image.exif_orientation"] == "none"
    assert facts["run.inputs.image.size"] == "1024, 701" and facts["run.options.kernel_quant"] == "no"
    assert facts["run.chunk"] == "none" and facts["run.tokens"].endswith("15, … (40 in all)")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("patches ", "scalar "))}
    assert " 6 × 9 " in rows["patches"] and " scalar " in rows["scalar"]


def test_console_script_and_pipe_output():
    p = subprocess.run([sys.executable, "-m", "tensordiff.commands.cli", "compare", str(SAMPLES / "sample-oracle"),
                        str(SAMPLES / "sample-engine")], capture_output=True, text=True)
    assert p.returncode == 1 and "earliest divergence at `rope`" in p.stdout and "\x1b[" not in p.stdout


def test_help_teaches():
    p = subprocess.run([sys.executable, "-m", "tensordiff.commands.cli", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "EARLIEST" in p.stdout and "compare" in p.stdout


# ---------------------------------------------------------------- interrupts and bad input

def test_ctrl_c_exits_130(capsys, monkeypatch):
    from tensordiff.pipeline import registry

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "names", interrupted)
    code, _, err = run(["faults"], capsys)
    assert code == 130 and err.strip() == "tensordiff: interrupted"


@pytest.mark.parametrize("kind", ["file", "inside-a-file"])
def test_cache_that_is_a_file(capsys, tmp_path, monkeypatch, kind):
    f = tmp_path / "cachefile"
    f.write_text("x")
    monkeypatch.setenv("TENSORDIFF_CACHE", str(f if kind == "file" else f / "sub"))
    code, _, err = run(["check", "deepseek-v4.1-flash"], capsys)
    assert code == 2 and "TENSORDIFF_CACHE" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f.read_text() == "x"


def test_cache_that_is_read_only(capsys, tmp_path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("TENSORDIFF_CACHE", str(ro))
    try:
        code, _, err = run(["check", "deepseek-v4.1-flash"], capsys)
    finally:
        ro.chmod(0o700)
    assert code == 2 and "not writable" in err


def test_compare_of_two_empty_dumps_exits_2(capsys, tmp_path):
    from tensordiff import Recorder

    for side in ("a", "b"):
        Recorder(tmp_path / side, model="toy").close()
    code, out, err = run(["compare", tmp_path / "a", tmp_path / "b"], capsys)
    assert code == 2 and "nothing to compare" in err and "MATCH" not in out


def test_non_utf8_tolerances_exit_2(capsys, tmp_path):
    t = tmp_path / "t.toml"
    t.write_bytes(b"\xff\xfe")
    code, _, err = run(["compare", SAMPLES / "sample-oracle", SAMPLES / "sample-engine", "--tolerances", t], capsys)
    assert code == 2 and "is not UTF-8" in err


def test_check_writes_a_junit_report_only_when_asked_for(tmp_path):
    """`check` with no --json/--junit/--html writes no report file; with --junit it writes one."""
    code = ("import sys\n"
            "from tensordiff.commands.cli import main\n"
            "try:\n"
            "    main(sys.argv[1:])\n"
            "except SystemExit as e:\n"
            "    print('exit', e.code)\n"
            "print('files', sorted(p.name for p in __import__('pathlib').Path('.').iterdir() if p.suffix == '.xml'))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORDIFF_CACHE": str(tmp_path / "cache")}
    plain = subprocess.run([sys.executable, "-c", code, "check", "deepseek-v4.1-flash"], capture_output=True,
                           text=True, env=env, cwd=tmp_path)
    assert "exit 0" in plain.stdout and "files []" in plain.stdout, plain.stdout + plain.stderr
    junit = subprocess.run([sys.executable, "-c", code, "check", "deepseek-v4.1-flash", "--junit",
                            str(tmp_path / "j.xml")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "exit 0" in junit.stdout and "files ['j.xml']" in junit.stdout, junit.stdout + junit.stderr
    assert "<testsuite" in (tmp_path / "j.xml").read_text()
