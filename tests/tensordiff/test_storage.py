"""Tensor files: a damaged HDF5 file is named in a one-line error, also when it breaks mid-read."""
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

    from tensordiff.storage import read_safetensors_header, read_safetensors_layout

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
