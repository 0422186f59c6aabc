"""What importers share: foreign names into dump names, and the dump they write."""
import numpy as np
import pytest

from tensordiff.format.dump import open_dump
from tensordiff.errors import BadInput
from tensordiff.format.importers import Imported, dump_name, write


@pytest.mark.parametrize("orig,want", [
    ("/proj/MatMul_output_0", "proj.MatMul_output_0"),
    ("onnx::Add_12", "onnx__Add_12"),
    ("a b//c", "a_b.c"),
    ("hidden", "hidden"),
    ("..", "_"),
    ("../../etc/passwd", "etc.passwd"),
])
def test_dump_names(orig, want):
    assert dump_name(orig) == want


def test_written_dump_keeps_order_boundaries_and_the_original_names(tmp_path):
    imp = Imported("tool", tmp_path / "src")
    imp.add("/b/x", np.zeros(2, np.float32), "b")
    imp.add("a", np.arange(3), None)
    imp.notes.append("a note")
    write(imp, tmp_path / "d", model="m")
    d = open_dump(tmp_path / "d")
    assert d.names == ["b.x", "a"] and [e.boundary for e in d.entries] == ["b", "a"]
    assert d.run["import"]["renamed"] == {"b.x": "/b/x"} and d.run["import"]["notes"] == ["a note"]
    assert d.producer["name"] == "tool"


def test_an_empty_import_or_a_name_collision_is_refused(tmp_path):
    with pytest.raises(BadInput, match="no tensors to import"):
        write(Imported("tool", tmp_path), tmp_path / "d", model="m")
    imp = Imported("tool", tmp_path)
    imp.add("a/b", np.zeros(1))
    with pytest.raises(BadInput, match="both become 'a.b'"):
        imp.add("a.b", np.zeros(1))
    assert not (tmp_path / "d").exists()
