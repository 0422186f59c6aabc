"""HDF5 datasets located from the file's own metadata (`hdf5_layout`): the same entry as h5py's
wherever it answers, None (h5py decides) wherever the structure is not the plain one."""
import contextlib
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers_dumps import write

from tensordiff import open_dump
from tensordiff.format.dtypes import BY_NAME
from tensordiff.format.hdf5_layout import Layout
from tensordiff.format.storage import plain_hdf5_entry, read_hdf5_entry, write_hdf5

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
from targets import SEEDS, check  # noqa: E402

ALL_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def _layout(p: Path):
    return contextlib.closing(Layout(p))


def test_every_dtype_and_shape_the_recorder_writes_is_located_as_h5py_locates_it(tmp_path):
    p = tmp_path / "t.h5"
    rng = np.random.default_rng(0)
    tensors = {}
    for name in ALL_DTYPES:
        dt = BY_NAME[name]
        for shape in ((), (1,), (3, 5), (2, 3, 4)):
            tensors[f"{name}.{len(shape)}"] = ((rng.random(shape) * 100).astype(dt.storage), dt)
    write_hdf5(p, tensors)
    with _layout(p) as lay:
        for key, (arr, dt) in tensors.items():
            fast = plain_hdf5_entry(lay, key, dt.name)
            if dt.name == "bool":  # h5py stores numpy bool as an HDF5 enum: not a plain type here
                assert fast is None
                continue
            assert fast is not None and fast == read_hdf5_entry(p, key, dt.name), key
            r = fast.reader()
            try:
                assert np.array_equal(r.read(0, fast.numel), arr.reshape(-1)), key
            finally:
                r.close()


def test_a_group_of_thousands_of_links_is_walked_whole(tmp_path):
    """600 links: a B-tree two levels deep (8 names a symbol node, 32 children a B-tree node)."""
    p = tmp_path / "t.h5"
    write_hdf5(p, {f"t{i}": (np.full(3, i, np.float32), BY_NAME["float32"]) for i in range(600)})
    with _layout(p) as lay:
        assert len(lay.links) == 600
        for i in (0, 1, 299, 599):
            st = plain_hdf5_entry(lay, f"t{i}", "float32")
            assert st == read_hdf5_entry(p, f"t{i}", "float32") and st.value_at(2) == i


def test_what_is_not_plain_is_left_to_h5py(tmp_path):
    p = tmp_path / "t.h5"
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with h5py.File(p, "w") as f:
        f.create_dataset("plain", data=x)
        f.create_dataset("chunked", data=x, chunks=(1, 4))
        f.create_dataset("gzip", data=x, chunks=(1, 4), compression="gzip")
        f.create_dataset("big", data=x.astype(">f4"))
        f.create_dataset("empty", shape=(0, 4), dtype=np.float32)
        f.create_dataset("late", shape=(3, 4), dtype=np.float32)  # never written: no storage
        f.create_group("g").create_dataset("inner", data=x)
        f["soft"] = h5py.SoftLink("/plain")
    with _layout(p) as lay:
        assert plain_hdf5_entry(lay, "plain", "float32") == read_hdf5_entry(p, "plain", "float32")
        for key in ("chunked", "gzip", "big", "empty", "late", "g", "g/inner", "soft", "missing"):
            assert plain_hdf5_entry(lay, key, "float32") is None, key
        assert plain_hdf5_entry(lay, "plain", None) is None  # no dtype in the manifest: its attribute
        assert plain_hdf5_entry(lay, "plain", "float16") is None  # sizes differ: h5py names the fault
        assert plain_hdf5_entry(lay, "plain", "no-such-type") is None


@pytest.mark.parametrize("kind", ["latest", "userblock", "track_order"])
def test_files_of_another_structure_are_left_to_h5py_whole(tmp_path, kind):
    p = tmp_path / "t.h5"
    kw = {"latest": {"libver": "latest"}, "userblock": {"userblock_size": 512},
          "track_order": {"track_order": True}}[kind]
    with h5py.File(p, "w", **kw) as f:
        f.create_dataset("x", data=np.ones(4, np.float32))
    with _layout(p) as lay:
        assert lay.links == {} and plain_hdf5_entry(lay, "x", "float32") is None
    assert read_hdf5_entry(p, "x", "float32").shape == (4,)  # h5py still reads it


def test_a_truncated_file_is_left_to_h5py_which_names_it(tmp_path):
    d = write(tmp_path / "h", {"x": torch.arange(100, dtype=torch.float32)}, fmt="hdf5")
    f = next(d.glob("*.h5"))
    f.write_bytes(f.read_bytes()[:-8])  # the last element's bytes gone: the superblock's end is past the file
    with _layout(f) as lay:
        assert plain_hdf5_entry(lay, "x", "float32") is None
    with pytest.raises(Exception, match="not a readable HDF5 file"):
        open_dump(d)


def test_a_dump_of_plain_datasets_is_opened_without_h5py(tmp_path, monkeypatch):
    d = write(tmp_path / "h", {f"layer.t{i}": torch.full((3, 4), float(i)) for i in range(40)}
              | {"flags": torch.tensor([True, False])}, fmt="hdf5")
    opened = []
    real = h5py.File
    monkeypatch.setattr(h5py, "File", lambda path, *a, **k: (opened.append(path), real(path, *a, **k))[1])
    dump = open_dump(d)
    assert opened == [d / "flags.h5"]  # the bool enum's file only: every layer.* dataset was plain
    monkeypatch.setattr(h5py, "File", real)
    assert all(e.stored.raw for e in dump.entries if e.name.startswith("layer."))
    assert dump.load("layer.t7").tolist() == [[7.0] * 4] * 3 and dump.load("flags").tolist() == [True, False]
    only_plain = write(tmp_path / "p", {f"t{i}": torch.full((2,), float(i)) for i in range(5)}, fmt="hdf5")
    monkeypatch.setattr(h5py, "File", lambda *a, **k: pytest.fail("h5py opened a file of plain datasets"))
    assert [e.name for e in open_dump(only_plain).entries] == [f"t{i}" for i in range(5)]


def test_the_fuzz_property_trips_on_a_planted_offset_bug(tmp_path, monkeypatch):
    """The fuzz target compares every in-place answer with h5py's: a reader that locates the data
    8 bytes off is caught on the seed itself."""
    assert check("hdf5-layout", SEEDS["hdf5-layout"][0], tmp_path / "ok") is None
    real = Layout._layout
    monkeypatch.setattr(Layout, "_layout", lambda self, p, n: (lambda r: r and (r[0] - 8, r[1]))(real(self, p, n)))
    found = check("hdf5-layout", SEEDS["hdf5-layout"][0], tmp_path / "bad")
    assert found is not None and "h5py says" in found
