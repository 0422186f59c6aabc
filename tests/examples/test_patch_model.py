"""The worked example of examples/patch_model: clean it matches, with the planted layout bug it
names `patches` (and only there is the root),
with the layout diagnosis that explains it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "patch_model" / "run.py"


def run(tmp_path, *args):
    """The example as a user runs it: its own process (the test of the clean run)."""
    p = subprocess.run([sys.executable, str(RUN), "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"),
                        *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    r = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    return p, r


@pytest.fixture(scope="module")
def example_main():
    """run.py's `main`, loaded once in this process (not as __main__, so nothing runs on load)."""
    import runpy

    path = list(sys.path)
    try:  # run.py puts its own folder first on sys.path for its `import reference`: not for later tests
        return runpy.run_path(str(RUN), run_name="patch_model_example")["main"]
    finally:
        sys.path[:] = path


def run_here(example_main, tmp_path, capsys, *args):
    """The example's `main` in this process: (exit status, stdout, stderr, the JSON report or None).
    A fresh interpreter a case would cost a torch import each; what differs between the cases is
    the bug and the output, not the process."""
    with pytest.raises(SystemExit) as e:
        example_main(["--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"), *args])
    out, err = capsys.readouterr()
    r = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    return e.value.code, out, err, r


def test_the_clean_reimplementation_matches(tmp_path):
    p, r = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["verdict"] == "match" and [b["name"] for b in r["boundaries"]] == [
        "patches", "embed", "block.0", "block.1", "final_norm"]
    assert r["producers"]["b"]["name"] == "plain safetensors" and r["model"] == "patch-model"


@pytest.mark.parametrize("bug, hypothesis", [("transposed-grid", "transposed-grid"), ("channels-last", "flatten-order")])
def test_a_planted_layout_bug_is_named_at_patches_with_its_diagnosis(example_main, tmp_path, capsys, bug, hypothesis):
    code, out, err, r = run_here(example_main, tmp_path, capsys, "--bug", bug)
    assert code == 1, out + err
    assert r["earliest"] == ["patches"] and "earliest divergence at `patches`" in out
    assert all(b["status"] == "consequent" for b in r["boundaries"][1:])
    # the layout diagnosis says what kind of wrong, and that it explains (nearly) all of the error
    (found,) = r["diagnosis"]["patches"]
    assert found["name"] == hypothesis and found["explained"] >= 0.95 and "diagnosis: patches:" in out


def test_an_existing_out_is_never_overwritten(example_main, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    code, _, err, _ = run_here(example_main, tmp_path, capsys)
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1


def test_without_out_the_dumps_are_the_last_runs_and_nothing_is_left_in_tmp(example_main, tmp_path, capsys,
                                                                            monkeypatch):
    """No --out: the dumps go to the cache's last-run directory (replaced by the next run), every
    path the report names exists afterwards, and no temporary directory is left behind."""
    import tempfile

    from tensordiff.pipeline.case import last_dir

    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    last = last_dir("example", "patch_model")
    for bug in ("transposed-grid", None):  # the second run replaces the first
        with pytest.raises(SystemExit) as e:
            example_main(["--json", str(tmp_path / "r.json"), *(["--bug", bug] if bug else [])])
        out, err = capsys.readouterr()
        r = json.loads((tmp_path / "r.json").read_text())
        assert e.value.code == (1 if bug else 0), out + err
        assert Path(r["a"]) == last / "reference" and Path(r["b"]) == last / "reimplementation.safetensors"
        assert Path(r["a"]).is_dir() and Path(r["b"]).is_file() and str(last) in out.splitlines()[0]
    assert list((tmp_path / "tmp").iterdir()) == [] and sorted(p.name for p in last.parent.iterdir()) == [last.name]
    (tmp_path / "r.json").unlink()
    # a directory of the user's own in that place is never replaced: one line, exit 2
    import shutil

    shutil.rmtree(last)
    last.mkdir()
    with pytest.raises(SystemExit) as e:
        example_main([])
    _, err = capsys.readouterr()
    assert e.value.code == 2 and "not a tensordiff last-run directory" in err and len(err.strip().splitlines()) == 1
    assert list(last.iterdir()) == []
