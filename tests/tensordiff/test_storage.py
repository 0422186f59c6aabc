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
