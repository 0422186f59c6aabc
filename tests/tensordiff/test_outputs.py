"""Report paths never land on an input or on a file that is not ours (tensordiff/reports/outputs.py)."""
import json
from pathlib import Path

import pytest
from helpers_dumps import pipeline, write

from cli_runner import run_cli as run
from tensordiff.errors import BadInput
from tensordiff.reports.outputs import dump_root, guard

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "dumps"




def snapshot(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture
def dumps(tmp_path):
    return write(tmp_path / "a", pipeline()), write(tmp_path / "b", pipeline(seed=1))


@pytest.mark.parametrize("option,target", [("--json", "a/manifest.json"), ("--html", "b/patches.safetensors"),
                                           ("--junit", "a/new.xml"), ("--json", "a")])
def test_a_report_inside_an_input_dump_is_refused(capsys, tmp_path, dumps, option, target):
    before = [snapshot(d) for d in dumps]
    code, _, err = run(["compare", *dumps, option, tmp_path / target], capsys)
    assert code == 2 and "cannot write" in err and len(err.strip().splitlines()) == 1
    assert [snapshot(d) for d in dumps] == before


def test_a_report_on_the_input_image_is_refused(capsys, tmp_path):
    img = tmp_path / "photo.png"
    img.write_bytes((ROOT / "tensordiff" / "data" / "default.png").read_bytes())
    before = img.read_bytes()
    code, _, err = run(["check", "deepseek-v4.1-flash", "--image", img, "--json", img], capsys)
    assert code == 2 and "is the input" in err
    assert img.read_bytes() == before


def test_an_existing_file_that_is_not_a_report_is_kept(capsys, tmp_path, dumps):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    code, _, err = run(["compare", *dumps, "--json", notes], capsys)
    assert code == 2 and "not a tensordiff json report" in err
    assert notes.read_text() == '{"mine": 1}'


def test_our_own_report_is_replaced(capsys, tmp_path, dumps):
    r = tmp_path / "r.json"
    for _ in range(2):  # the second run replaces the first run's report
        code, _, _ = run(["compare", *dumps, "--json", r, "--html", tmp_path / "r.html", "--junit", tmp_path / "r.xml"],
                         capsys)
        assert code == 1
    assert json.loads(r.read_text())["verdict"] == "diverged"


def test_two_options_naming_one_file_are_refused(capsys, tmp_path, dumps):
    code, _, err = run(["compare", *dumps, "--json", tmp_path / "r", "--html", tmp_path / "r"], capsys)
    assert code == 2 and "both name" in err


def test_guard_kinds_and_inputs(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(BadInput, match="inside the input"):
        guard(ckpt / "cal.toml", "--out", "calibration", [ckpt])
    other = tmp_path / "tol.toml"
    other.write_text("[tolerances]\n")
    with pytest.raises(BadInput, match="not a tensordiff calibration report"):
        guard(other, "--out", "calibration", [])
    other.write_text("# Noise floors measured by `tensordiff calibrate`, and tolerances\n")
    guard(other, "--out", "calibration", [])  # ours: may be replaced
    (tmp_path / "empty.xml").write_text("")
    guard(tmp_path / "empty.xml", "--junit", "junit", [])  # nothing to lose
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(BadInput, match="not a tensordiff json report"):
        guard(link, "--json", "json", [])


def test_check_out_that_is_a_file(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("keep")
    code, _, err = run(["check", "deepseek-v4.1-flash", "--out", f], capsys)
    assert code == 2 and "is a file" in err and f.read_text() == "keep"
    with pytest.raises(BadInput, match="is a file"):
        dump_root(f)


def test_check_out_in_a_read_only_directory(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(BadInput, match="cannot create"):
            dump_root(ro / "out")
    finally:
        ro.chmod(0o700)
