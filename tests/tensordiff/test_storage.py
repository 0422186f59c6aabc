"""Tensor files: a damaged HDF5 file is named in a one-line error, also when it breaks mid-read."""
import contextlib

import pytest
import torch
from helpers_dumps import write

from tensordiff import BadInput, open_dump


def test_an_hdf5_file_damaged_after_opening_names_the_file(tmp_path):
    d = write(tmp_path / "d", {"x": torch.arange(4096, dtype=torch.float32)}, fmt="hdf5")
    e = open_dump(d).entry("x")
    f = e.stored.file
    f.write_bytes(f.read_bytes()[:1024])  # truncated between opening the dump and streaming it
    with pytest.raises(BadInput, match=rf"{f}: HDF5 dataset 'x' cannot be read"):
        r = e.stored.reader()
        r.read(0, 4096)


def test_an_hdf5_file_that_is_garbage_names_the_file(tmp_path):
    d = write(tmp_path / "d", {"x": torch.ones(3)}, fmt="hdf5")
    f = next(d.glob("*.h5"))
    f.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(BadInput, match=rf"{f}: not a readable HDF5 file"):
        open_dump(d)


def test_a_checkpoint_shard_layout_takes_any_dtype_a_dump_does_not(tmp_path):
    """An FP8 checkpoint shard (F8_E4M3 weights) is checked for its structure only; a dump's
    tensors must have a dtype the comparator reads."""
    import json as _json
    import struct as _struct

    from tensordiff.format.storage import read_safetensors_header, read_safetensors_layout

    hb = _json.dumps({"w": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]}}).encode()
    p = tmp_path / "fp8.safetensors"
    p.write_bytes(_struct.pack("<Q", len(hb)) + hb + bytes(6))
    layout, _ = read_safetensors_layout(p)
    assert layout["w"][:2] == ("F8_E4M3", (2, 3)) and layout["w"][3] - layout["w"][2] == 6
    with pytest.raises(BadInput, match="unreadable header entry"):
        read_safetensors_header(p)
    p.write_bytes(_struct.pack("<Q", len(hb)) + hb + bytes(5))  # one byte short: truncated either way
    with pytest.raises(BadInput, match="truncated"):
        read_safetensors_layout(p)


# ----------------------------------------------------------------------------- shared mappings, HDF5 in place

def test_readers_share_one_mapping_per_file_inside_shared_files(tmp_path):
    import numpy as np

    from tensordiff.format import storage

    d = write(tmp_path / "d", {"x.a": torch.arange(10.0), "x.b": torch.arange(5.0) * 2})
    ea, eb = open_dump(d).entry("x.a"), open_dump(d).entry("x.b")
    with storage.shared_files():
        ra, rb = ea.stored.reader(), eb.stored.reader()
        assert ra.mm is rb.mm  # one file, one mapping
        assert np.array_equal(ra.read(0, 10), np.arange(10.0, dtype=np.float32))
        assert np.array_equal(rb.read(1, 3), [2.0, 4.0])
    ra2, rb2 = ea.stored.reader(), eb.stored.reader()
    assert ra2.mm is not rb2.mm  # outside a block every reader maps for itself


def test_a_dump_rewritten_between_two_comparisons_is_read_afresh(tmp_path):
    # no mapping outlives its comparison: the second one sees the new bytes, not the old file's
    from tensordiff.pipeline.compare import compare_dumps

    a = write(tmp_path / "a", {"x": torch.ones(64)})
    b = write(tmp_path / "b", {"x": torch.ones(64)})
    assert compare_dumps(a, b).verdict == "match"
    import shutil

    shutil.rmtree(b)
    write(tmp_path / "b", {"x": torch.ones(64) * 3})
    assert compare_dumps(a, b).verdict == "diverged"


def test_released_pages_shared_with_a_neighbour_lose_nothing(tmp_path):
    import numpy as np

    from tensordiff.format import storage

    xs = {f"t.{i}": torch.arange(i, i + 777, dtype=torch.float32) for i in range(12)}  # 3108-byte tensors
    d = write(tmp_path / "d", xs)
    dump = open_dump(d)
    with storage.shared_files():
        for i in range(12):
            r = dump.entry(f"t.{i}").stored.reader()
            r.read(0, 777)
            r.release(0, 777)  # also drops the pages it shares with t.{i-1} and t.{i+1}
        for i in range(12):
            r = dump.entry(f"t.{i}").stored.reader()
            assert np.array_equal(r.read(0, 777), np.arange(i, i + 777, dtype=np.float32))


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "compressed"])
def test_hdf5_datasets_read_in_place_when_they_can_and_through_h5py_otherwise(tmp_path, layout):
    import h5py
    import numpy as np

    from tensordiff.format import storage
    from tensordiff.format.dtypes import BY_NAME

    x = np.arange(6000, dtype=np.float32).reshape(60, 100) * 0.5
    p = tmp_path / "t.h5"
    with h5py.File(p, "w") as f:
        kw = {"contiguous": {}, "chunked": {"chunks": (7, 100)}, "compressed": {"compression": "gzip"}}[layout]
        f.create_dataset("x", data=x, **kw)
    st = storage.read_hdf5_entry(p, "x", "float32")
    assert st.raw == (layout == "contiguous") and st.dtype is BY_NAME["float32"]
    r = st.reader()
    try:
        assert np.array_equal(r.read(0, 6000), x.reshape(-1))
        assert np.array_equal(r.read(1234, 1240), x.reshape(-1)[1234:1240])
    finally:
        r.close()
    assert st.mapped == (layout == "contiguous")
    for flat in (0, 1234, 5999):  # one element, in place or through h5py: the same value
        assert st.value_at(flat) == x.reshape(-1)[flat]


def test_a_big_endian_hdf5_dataset_is_not_read_in_place(tmp_path):
    import h5py
    import numpy as np

    from tensordiff.format import storage

    p = tmp_path / "t.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.arange(10, dtype=">f4"))
    st = storage.read_hdf5_entry(p, "x", "float32")
    assert not st.raw  # its bytes are not the little-endian elements the comparator reads


def test_small_releases_are_gathered_but_every_page_goes_and_the_backlog_is_bounded(tmp_path, monkeypatch):
    import mmap

    from tensordiff.format import storage

    xs = {f"t.{i}": torch.arange(i, i + 1000, dtype=torch.float32) for i in range(200)}  # 4 kB each
    dump = open_dump(write(tmp_path / "d", xs))
    calls = []
    real = storage._madvise
    monkeypatch.setattr(storage, "_madvise", lambda mm, b0, b1: (calls.append((b0, b1)), real(mm, b0, b1)))
    monkeypatch.setattr(storage, "MAX_DEFERRED", 64 << 10)
    wanted = []
    with storage.shared_files():
        scope = storage._SCOPE.get()
        backlog = 0
        for i in range(200):
            st = dump.entry(f"t.{i}").stored
            r = st.reader()
            r.read(0, 1000)
            r.release(0, 1000)
            wanted.append((st.offset // mmap.PAGESIZE * mmap.PAGESIZE, st.offset + st.nbytes))
            backlog = max(backlog, scope.deferred)
    assert 0 < len(calls) < 200 / 4  # far fewer calls than tensors
    assert backlog < (64 << 10) + 2 * mmap.PAGESIZE  # never more than MAX_DEFERRED waiting
    for lo, hi in wanted:  # every released range lies inside one released extent
        assert any(b0 <= lo and hi <= b1 for b0, b1 in calls), (lo, hi)


def test_outside_shared_files_a_release_is_immediate(tmp_path, monkeypatch):
    from tensordiff.format import storage

    dump = open_dump(write(tmp_path / "d", {"x": torch.ones(5000)}))
    calls = []
    monkeypatch.setattr(storage, "_madvise", lambda mm, b0, b1: calls.append((b0, b1)))
    r = dump.entry("x").stored.reader()
    r.read(0, 5000)
    r.release(0, 5000)
    assert len(calls) == 1


@pytest.mark.parametrize("fmt", ["safetensors", "hdf5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_one_element_is_read_in_place_inside_and_outside_shared_files(tmp_path, fmt, dtype):
    from tensordiff.format import storage

    d = write(tmp_path / "d", {"x": torch.arange(5000, dtype=torch.float32) * 0.25,
                               "y": torch.arange(7, dtype=torch.int32) - 3}, fmt=fmt)
    dump = open_dump(d)
    x, y = dump.entry("x").stored, dump.entry("y").stored
    z = open_dump(write(tmp_path / "z", {"z": torch.tensor([1.5, -2.0, 3.0e38, 1e-40]).to(dtype)}, fmt=fmt)).entry("z").stored
    assert [z.value_at(i) for i in range(4)] == torch.tensor([1.5, -2.0, 3.0e38, 1e-40]).to(dtype).double().tolist()
    for scope in (storage.shared_files(), contextlib.nullcontext()):
        with scope:
            assert [x.value_at(i) for i in (0, 1, 4999)] == [0.0, 0.25, 1249.75]
            assert [y.value_at(i) for i in (0, 6)] == [-3, 3] and type(y.value_at(0)) is int


def test_hdf5_entries_are_the_same_by_either_lookup(tmp_path):
    """A dataset whose dtype the manifest gives is opened through h5py's low-level API (opening a
    dump of thousands of them); one without, through the high-level one (its dtype attribute).
    Both routes give the same entry for every layout, and the same one-line fault."""
    import h5py
    import numpy as np

    from tensordiff.format.storage import read_hdf5_entry

    p = tmp_path / "t.h5"
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with h5py.File(p, "w") as f:
        for name, kw in {"plain": {}, "chunked": {"chunks": (1, 4)}, "gzip": {"chunks": (1, 4), "compression": "gzip"},
                         "shuffled": {"chunks": (1, 4), "shuffle": True}}.items():
            f.create_dataset(name, data=x, **kw).attrs["dtype"] = np.bytes_("float32")
        f.create_dataset("scalar", data=np.float32(3)).attrs["dtype"] = np.bytes_("float32")
        f.create_dataset("empty", shape=(0, 4), dtype=np.float32).attrs["dtype"] = np.bytes_("float32")
        f.create_dataset("late", shape=(3, 4), dtype=np.float32).attrs["dtype"] = np.bytes_("float32")  # unallocated
        f.create_group("group")
        f["soft"] = h5py.SoftLink("/plain")
    raw = {}
    for key in ("plain", "chunked", "gzip", "shuffled", "scalar", "empty", "late", "soft"):
        low, high = read_hdf5_entry(p, key, "float32"), read_hdf5_entry(p, key, None)
        assert low == high, key
        raw[key] = low.raw
    assert raw == {"plain": True, "chunked": False, "gzip": False, "shuffled": False, "scalar": True,
                   "empty": False, "late": False, "soft": True}
    for key in ("group", "missing", "a/b"):
        with pytest.raises(BadInput, match=f"no dataset '{key}'"):
            read_hdf5_entry(p, key, "float32")


def test_a_streamed_tensors_releases_are_gathered_into_huge_page_aligned_extents(tmp_path, monkeypatch):
    # one madvise per RELEASE_SPAN, not one per chunk (each interrupts the other cores for a TLB
    # flush), every released range but the last ending on a HUGE_PAGE boundary (a range ending
    # inside a huge page splits it), every page released in the end and the backlog bounded
    import mmap

    from tensordiff.format import storage

    span, huge = 4 << 20, storage.HUGE_PAGE
    monkeypatch.setattr(storage, "RELEASE_SPAN", span)
    n = 4 << 20  # 16 MB of float32, in chunks of 1.2 MB (no page multiple)
    dump = open_dump(write(tmp_path / "d", {"x": torch.arange(n, dtype=torch.float32)}))
    st = dump.entry("x").stored
    calls = []
    real = storage._madvise
    monkeypatch.setattr(storage, "_madvise", lambda mm, b0, b1: (calls.append((b0, b1)), real(mm, b0, b1)))
    step, backlog = 300_000, 0
    with storage.shared_files():
        scope = storage._SCOPE.get()
        r = st.reader()
        for s in range(0, n, step):
            r.read(s, min(n, s + step))
            r.release(s, min(n, s + step))
            backlog = max(backlog, scope.deferred)
        r.close()
    assert len(calls) <= st.nbytes // span + 2 < -(-n // step)  # gathered: far fewer calls than chunks
    size = st.file.stat().st_size
    assert all(b1 % huge == 0 or b1 == size for _, b1 in calls[:-1]), calls  # on huge-page boundaries (or the end)
    assert all(b1 > b0 for b0, b1 in calls)
    covered = sorted(calls)
    assert covered[0][0] <= st.offset // mmap.PAGESIZE * mmap.PAGESIZE and covered[-1][1] >= st.offset + st.nbytes
    assert all(a[1] >= b[0] for a, b in zip(covered, covered[1:]))  # no page left out between them
    assert backlog < span + huge + 4 * step  # never more than a span, a huge page and a chunk waiting
