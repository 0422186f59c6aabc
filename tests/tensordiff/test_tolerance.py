import pytest
import torch
from helpers_dumps import write

from tensordiff.compare import compare_dumps
from tensordiff.errors import BadInput
from tensordiff.tolerance import DEFAULTS, load


def test_defaults_follow_the_unit_roundoff():
    assert DEFAULTS["bfloat16"].rtol == pytest.approx(4 * 2 ** -8, rel=0.03)
    assert DEFAULTS["float32"].rtol < DEFAULTS["float16"].rtol * 1.0 or DEFAULTS["float32"].atol < DEFAULTS["bfloat16"].atol


def test_boundary_override_wins_over_dtype(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text("""
[tolerances.float32]
atol = 0.5
[tolerances.boundaries.aligner]
atol = 0.01
[tolerances.boundaries."router.*".float32]
max_mismatch = 0.25
""")
    t = load(p)
    assert t.for_("block0", "float32").atol == 0.5
    assert t.for_("aligner", "float32").atol == 0.01
    assert t.for_("aligner", "bfloat16").atol == 0.01
    assert t.for_("router.3", "float32").max_mismatch == 0.25 and t.for_("router.3", "float32").atol == 0.5
    assert t.for_("block0", "bfloat16") == DEFAULTS["bfloat16"]


def test_override_changes_the_verdict(tmp_path):
    x = torch.randn(50)
    a, b = write(tmp_path / "a", {"x": x}), write(tmp_path / "b", {"x": x + 0.05})
    assert compare_dumps(a, b).verdict == "diverged"
    p = tmp_path / "t.toml"
    p.write_text("[tolerances.boundaries.x]\natol = 0.06\nmin_cosine = 0.99\n")
    assert compare_dumps(a, b, p).verdict == "match"


def test_pyproject_tool_table(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[tool.tensordiff.tolerances.float32]\natol = 0.125\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    t = load()
    assert t.for_("x", "float32").atol == 0.125 and "pyproject" in t.origin


@pytest.mark.parametrize("text,match", [
    ("[tolerances.float32]\natol = -1\n", "non-negative"),
    ("[tolerances.float32]\nbogus = 1\n", "unknown key"),
    ("[tolerances.nonsense]\natol = 1\n", "unknown tolerance table"),
    ("[tolerances\n", "not valid TOML"),
])
def test_bad_tolerance_files(tmp_path, text, match):
    p = tmp_path / "t.toml"
    p.write_text(text)
    with pytest.raises(BadInput, match=match):
        load(p)


def test_missing_tolerance_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load(tmp_path / "nope.toml")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.5", "-1e-30"])
@pytest.mark.parametrize("field", ["atol", "rtol"])
def test_nan_infinite_and_negative_tolerances_refused(tmp_path, field, value):
    p = tmp_path / "t.toml"
    p.write_text(f"[tolerances.boundaries.rope]\n{field} = {value}\n")
    with pytest.raises(BadInput, match="finite non-negative"):
        load(p)


def test_a_tolerance_file_that_is_not_utf8(tmp_path):
    p = tmp_path / "t.toml"
    p.write_bytes(b"# caf\xe9\n[tolerances.float32]\natol = 1e-3\n")
    with pytest.raises(BadInput, match=r"t.toml is not UTF-8 text \(byte 5\)"):
        load(p)


@pytest.mark.parametrize("content", [b"[tool.tensordiff\n", b"\xff\xfe[tool]\n"])
def test_a_broken_parent_pyproject_is_named_in_a_warning(tmp_path, monkeypatch, capsys, content):
    (tmp_path / "pyproject.toml").write_bytes(content)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    t = load()
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'pyproject.toml'} cannot be read" in err and "defaults apply" in err
    assert t.for_("x", "float32") == DEFAULTS["float32"]
