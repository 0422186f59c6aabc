"""The text report: rows left out are counted, NaN rows and ULP inf say what they mean."""
import pytest
import torch
from helpers_dumps import write

from tensordiff.commands.cli import main
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.reports.text import ULP_INF_NOTE, render_text


def _many(tmp_path, n=230):
    x = {f"t{i:03d}": torch.full((2,), float(i)) for i in range(n)}
    return write(tmp_path / "a", x), write(tmp_path / "b", x)


def test_a_cut_table_says_how_many_rows_were_left_out(tmp_path):
    a, b = _many(tmp_path)
    text = render_text(compare_dumps(a, b))
    assert "... 30 more rows not shown (of 230); see --json for all of them, or pass --all" in text
    assert "t199" in text and "t200" not in text


def test_all_rows_and_no_cut_note_when_everything_fits(tmp_path):
    a, b = _many(tmp_path)
    text = render_text(compare_dumps(a, b), None)
    assert "t229" in text and "more rows not shown" not in text


def test_cli_all_option(tmp_path, capsys):
    a, b = _many(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["compare", str(a), str(b), "--all"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "t229" in out and "more rows" not in out


def test_a_nan_row_is_not_shown_as_a_clean_match(tmp_path):
    x = torch.linspace(-1, 1, 64)
    y = x.clone()
    y[3] = float("nan")
    a, b = write(tmp_path / "a", {"h": x}), write(tmp_path / "b", {"h": y})
    text = render_text(compare_dumps(a, b))
    row = next(line for line in text.splitlines() if line.startswith("h "))
    assert "DIVERGED" in row and "1 NaN/Inf on one side only (NaN: A 0, B 1); finite pairs: " in row


def test_ulp_inf_is_explained(tmp_path):
    a = write(tmp_path / "a", {"s": torch.tensor([0.0, 0.5])})
    b = write(tmp_path / "b", {"s": torch.tensor([0.9, 0.5])})
    text = render_text(compare_dumps(a, b))
    assert "/inf (float32)" in text and f"note: {ULP_INF_NOTE}" in text
    clean = render_text(compare_dumps(a, write(tmp_path / "c", {"s": torch.tensor([0.0, 0.5])})))
    assert ULP_INF_NOTE not in clean
