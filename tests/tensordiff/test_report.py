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


def _table_lines(text: str) -> list[str]:
    """The boundary table: from its header to the first note."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("boundary "))
    return [line for line in lines[start:] if not line.startswith(("note:", "..."))]


def test_columns_fit_their_contents_and_a_long_name_is_cut_where_marked(tmp_path):
    """A root's status and a long tensor name never push a column out of line: every column
    starts where its header does; a name over the cap is cut in the middle, marked `…`."""
    from tensordiff.reports.text import CAPS

    long = "language_model.layers.11.self_attention.o_proj.output.with.a.very.long.suffix"
    x = torch.linspace(-1, 1, 64)
    a = write(tmp_path / "a", {"patches": x, "rope.cos": x, long: x},
              boundaries={"patches": "patches", "rope.cos": "rope", long: "rope"})
    b = write(tmp_path / "b", {"patches": x, "rope.cos": -x, long: x},
              boundaries={"patches": "patches", "rope.cos": "rope", long: "rope"})
    rep = compare_dumps(a, b)
    table = _table_lines(render_text(rep))
    head = table[0]
    starts = [head.index(h) for h in ("status", "tensor", "dtype", "metrics")]
    assert starts[0] == len("boundary") + 1  # as wide as its widest cell or its header, no wider
    root = next(line for line in table if "DIVERGED (root)" in line)
    for line in table[1:]:
        for s in starts[0 if line[0] != " " else 1:]:  # a boundary's further tensors leave the first two blank
            assert line[s - 1] == " " and line[s] != " ", (line, s)  # each cell begins at its header
    assert root[starts[0]:starts[1]].rstrip() == "DIVERGED (root)"
    cut = next(line for line in table if "…" in line)[starts[1]:starts[2]].rstrip()
    assert len(cut) == CAPS["tensor"] and cut.startswith("language_model.") and cut.endswith(".very.long.suffix")
    assert starts[2] - starts[1] == CAPS["tensor"] + 1


def test_a_missing_tensor_shows_missing_not_none(tmp_path):
    x = torch.linspace(-1, 1, 64)
    a = write(tmp_path / "a", {"patches": x, "patches.extra": x.to(torch.bfloat16)},
              boundaries={"patches.extra": "patches"})
    b = write(tmp_path / "b", {"patches": x})
    rep = compare_dumps(a, b)
    (t,) = [t for t in rep.boundaries[0].tensors if t.status == "missing"]
    assert t.dtype == {"a": "bfloat16"}  # the side that has it
    table = _table_lines(render_text(rep))
    dtype_col = table[0].index("dtype")
    row = next(line for line in table if "patches.extra" in line)
    assert row[dtype_col:].startswith("bfloat16 vs missing ") and "None" not in render_text(rep)
    from tensordiff.pipeline.case import lone_case
    from tensordiff.reports.html import render_html

    html = render_html([lone_case(rep)])
    assert "bfloat16 vs missing" in html and ">None<" not in html
