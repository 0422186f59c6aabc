import json
import pickle
import struct

import pytest
import torch
from helpers_dumps import pipeline, write

from tensordiff import BadInput, open_dump


@pytest.fixture
def dump(tmp_path):
    return write(tmp_path / "d", pipeline())


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def _save(d, m):
    (d / "manifest.json").write_text(json.dumps(m))


def test_missing_manifest(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="no manifest.json"):
        open_dump(tmp_path / "empty")


def test_malformed_manifest(dump):
    (dump / "manifest.json").write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        open_dump(dump)


def test_wrong_format_and_version(dump):
    m = _manifest(dump)
    _save(dump, {**m, "version": 2})
    with pytest.raises(BadInput, match="version"):
        open_dump(dump)
    _save(dump, {**m, "format": "other"})
    with pytest.raises(BadInput, match="format"):
        open_dump(dump)


def test_unknown_fields_ignored_and_boundary_optional(dump):
    m = _manifest(dump)
    m["future"] = {"x": 1}
    for t in m["tensors"]:
        t.pop("boundary")
        t["new_field"] = 3
    _save(dump, m)
    d = open_dump(dump)
    assert d.entry("rope.cos").boundary == "rope"


def test_manifest_naming_a_missing_file(dump):
    (dump / "block0.safetensors").unlink()
    with pytest.raises(BadInput, match="missing"):
        open_dump(dump)


def test_truncated_safetensors(dump):
    p = dump / "block0.safetensors"
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(BadInput, match="truncated"):
        open_dump(dump)
    p.write_bytes(b"\x01\x02")
    with pytest.raises(BadInput, match="truncated"):
        open_dump(dump)


def test_corrupt_safetensors_header(dump):
    p = dump / "block0.safetensors"
    data = p.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    p.write_bytes(data[:8] + b"#" * n + data[8 + n:])
    with pytest.raises(BadInput, match="corrupt"):
        open_dump(dump)


def test_truncated_hdf5(tmp_path):
    d = write(tmp_path / "h", pipeline(), fmt="hdf5")
    p = d / "block0.h5"
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(BadInput):
        open_dump(d)


@pytest.mark.parametrize("bad", ["../outside.safetensors", "/etc/passwd.safetensors", "sub/../../x.safetensors"])
def test_paths_cannot_escape(dump, bad):
    m = _manifest(dump)
    m["tensors"][0]["file"] = bad
    _save(dump, m)
    with pytest.raises(BadInput, match="escapes"):
        open_dump(dump)


def test_symlink_escaping_the_directory(dump, tmp_path):
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((dump / "block0.safetensors").read_bytes())
    (dump / "link.safetensors").symlink_to(outside)
    m = _manifest(dump)
    m["tensors"][0]["file"] = "link.safetensors"
    _save(dump, m)
    with pytest.raises(BadInput, match="escapes"):
        open_dump(dump)


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b"])
def test_bad_tensor_names(dump, name):
    m = _manifest(dump)
    m["tensors"][0]["name"] = name
    _save(dump, m)
    with pytest.raises(BadInput, match="invalid name"):
        open_dump(dump)


def test_pickle_is_never_opened(tmp_path, dump):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    pt = tmp_path / "evil.pt"
    pt.write_bytes(pickle.dumps(Boom()))
    with pytest.raises(BadInput, match="never unpickles"):
        open_dump(pt)
    (dump / "evil.pt").write_bytes(pt.read_bytes())
    m = _manifest(dump)
    m["tensors"][0]["file"] = "evil.pt"
    _save(dump, m)
    with pytest.raises(BadInput, match="never unpickles"):
        open_dump(dump)


def test_manifest_and_file_disagree(dump):
    m = _manifest(dump)
    m["tensors"][0]["shape"] = [1, 2]
    _save(dump, m)
    with pytest.raises(BadInput, match="shape"):
        open_dump(dump)
    m["tensors"][0]["shape"] = None
    m["tensors"][0]["dtype"] = "int32"
    _save(dump, m)
    with pytest.raises(BadInput, match="int32"):
        open_dump(dump)


def test_opening_reads_no_tensor_data(dump, monkeypatch):
    import numpy as np

    def boom(*a, **k):
        raise AssertionError("tensor data read on open")

    monkeypatch.setattr(np, "memmap", boom)
    d = open_dump(dump)
    assert len(d.entries) == 6 and d.nbytes > 0


def test_empty_tensor_roundtrip(tmp_path):
    d = write(tmp_path / "d", {"e": torch.zeros(0, 4)})
    assert open_dump(d).entry("e").shape == (0, 4)


# ---------------------------------------------------------------- bad dumps: one line, exit 2, never a traceback

@pytest.mark.parametrize("shape", [5, "3x4", [3.0, 4], [-1], {"a": 1}, [True]])
def test_manifest_shape_not_a_list_of_ints(dump, shape):
    m = _manifest(dump)
    m["tensors"][0]["shape"] = shape
    _save(dump, m)
    with pytest.raises(BadInput, match="a shape is a list of non-negative integers"):
        open_dump(dump)


@pytest.mark.parametrize("fname", ["patches\x00.safetensors", "pat\nches.safetensors"])
def test_control_characters_in_a_file_name(dump, fname):
    m = _manifest(dump)
    m["tensors"][0]["file"] = fname
    _save(dump, m)
    with pytest.raises(BadInput, match="control character"):
        open_dump(dump)


def test_manifest_link_out_of_the_dump_is_confined(dump, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (dump / "manifest.json").rename(outside / "manifest.json")
    (dump / "manifest.json").symlink_to(outside / "manifest.json")
    with pytest.raises(BadInput, match="outside the dump directory"):
        open_dump(dump)


def test_manifest_link_inside_the_dump_is_fine(dump):
    (dump / "manifest.json").rename(dump / "real.json")
    (dump / "manifest.json").symlink_to("real.json")
    assert open_dump(dump).names


@pytest.mark.parametrize("name", ["patches\n", "a\tb"])
def test_names_with_a_trailing_newline_refused_when_read(dump, name):
    m = _manifest(dump)
    m["tensors"][0]["name"] = name
    _save(dump, m)
    with pytest.raises(BadInput, match="invalid name"):
        open_dump(dump)


def test_an_hdf5_file_of_many_datasets_is_opened_once(tmp_path, monkeypatch):
    import h5py

    d = write(tmp_path / "h", {f"layer.t{i}": torch.full((3, 4), float(i)) for i in range(30)}, fmt="hdf5")
    opened = []
    real = h5py.File

    def counting(path, *a, **k):
        opened.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(h5py, "File", counting)
    dump = open_dump(d)
    # one file, opened at most once (not once per entry): its plain datasets are located from the
    # file's own metadata without h5py at all (tests/tensordiff/test_hdf5_layout.py)
    assert len(dump.entries) == 30 and len(opened) <= 1
    monkeypatch.setattr(h5py, "File", real)
    assert all(e.stored.raw for e in dump.entries)  # contiguous datasets: read in place
    assert dump.load("layer.t7").tolist() == [[7.0] * 4] * 3


def test_a_file_named_by_many_entries_is_checked_once_and_still_checked(dump):
    # rope.cos and rope.sin share rope.safetensors: the second spelling of it is checked afresh
    m = _manifest(dump)
    files = {t["name"]: t["file"] for t in m["tensors"]}
    assert files["rope.cos"] == files["rope.sin"]
    assert open_dump(dump).entry("rope.sin").stored.file == open_dump(dump).entry("rope.cos").stored.file
    for t in m["tensors"]:
        if t["name"] == "rope.sin":
            t["file"] = "../" + dump.name + "/" + t["file"]
    _save(dump, m)
    with pytest.raises(BadInput, match="escapes"):
        open_dump(dump)
