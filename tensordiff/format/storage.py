"""Tensor files of a dump: safetensors and HDF5, read lazily, written exactly.

The safetensors side is our own small reader/writer of the documented format (8-byte
little-endian header length, JSON header, raw little-endian C-order bytes): it lets us
memory-map and validate every offset, and it handles bfloat16 without torch. HDF5 keeps bf16
as uint16 with a `dtype` attribute. Nothing here can unpickle.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import mmap
import os
import struct
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensordiff.format.dtypes import BY_NAME, BY_ST, by_name, DType, to_float64
from tensordiff.errors import BadInput

MAX_HEADER = 100 * 1024 * 1024
SAFETENSORS_EXT = (".safetensors",)
HDF5_EXT = (".h5", ".hdf5")
PICKLE_EXT = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt")


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are, without reading them."""

    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: DType
    offset: int = 0  # safetensors: absolute byte offset of the data
    raw: bool = False  # HDF5: the dataset's bytes lie as they are at `offset` (contiguous, unfiltered,
    # little-endian), so they are mapped like a safetensors tensor's instead of read through h5py

    @functools.cached_property  # asked several times per tensor by a comparison
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @functools.cached_property
    def mapped(self) -> bool:
        """Read through a mapping of the file (safetensors, raw HDF5), not through h5py. Cached:
        Path.suffix costs ~5 us, and a comparison asks it several times per tensor."""
        return not (self.file.suffix in HDF5_EXT and not self.raw)

    def reader(self) -> "FlatReader":
        return _MemmapReader(self) if self.mapped else _H5Reader(self)

    def value_at(self, flat: int) -> float | int:
        """Element `flat` as a Python number (a float widened exactly, an integer as it is): unpacked
        from the shared mapping where there is one (~1 us; no reader or array for one element),
        else read through a reader."""
        fmt = _STRUCT.get(self.dtype.name)
        if self.mapped and fmt and 0 <= flat < self.numel:
            try:
                (v,) = struct.unpack_from(fmt, _map_file(self.file), self.offset + flat * self.dtype.itemsize)
            except (OSError, ValueError, struct.error):  # changed under us: the reader names the damage
                pass
            else:
                if self.dtype.name == "bfloat16":  # the top half of a float32: exact
                    (v,) = struct.unpack("<f", struct.pack("<I", v << 16))
                return float(v) if self.dtype.is_float else int(v)

        r = self.reader()
        try:
            x = r.read(flat, flat + 1)
        finally:
            r.close()
        return float(to_float64(x, self.dtype)[0]) if self.dtype.is_float else int(x[0])


# struct formats of the stored elements (little-endian, as the files hold them)
_STRUCT = {"float64": "<d", "float32": "<f", "float16": "<e", "bfloat16": "<H", "int64": "<q", "int32": "<i",
           "int16": "<h", "int8": "<b", "uint8": "<B", "bool": "<?"}


# Mappings of whole tensor files, shared by every reader inside `shared_files()`: a dump of
# thousands of small tensors in a few files maps each file once, not each tensor (an np.memmap
# per tensor and side cost ~90 us). Bounded: an evicted mapping lives on while a reader holds it.
MAX_SHARED_MAPS = 64
# Inside a block, releases are gathered into one extent per mapping (chunks finish nearly in order,
# so each one touches its mapping's extent) and released once an extent reaches RELEASE_SPAN bytes:
# every madvise of a multi-threaded process sends the other cores a TLB-flush interrupt, which in a
# VM costs tens of microseconds, so one per 4 MB chunk and side was ~15% of a big comparison. The
# released part ends on a HUGE_PAGE boundary and the rest stays in the extent: a range that ends
# inside a huge page mapped whole splits it, with one more flush. Resident memory stays within
# about RELEASE_SPAN + HUGE_PAGE bytes per mapping, and MAX_DEFERRED over all of them, of what is
# being read.
RELEASE_SPAN = 16 << 20
HUGE_PAGE = 2 << 20
MAX_DEFERRED = 64 << 20


class _Scope:
    def __init__(self):
        self.maps: OrderedDict[Path, mmap.mmap] = OrderedDict()
        self.pending: dict[int, list] = {}  # id(mapping) -> [mapping, first byte, end byte]
        self.deferred = 0
        self.lock = threading.Lock()

    def release(self, mm: mmap.mmap, b0: int, b1: int) -> None:
        with self.lock:
            p = self.pending.get(id(mm))
            if p is not None and p[0] is mm and b0 <= p[2] and b1 >= p[1]:  # touches the extent: grow it
                self.deferred += max(0, p[1] - b0) + max(0, b1 - p[2])
                p[1], p[2] = min(p[1], b0), max(p[2], b1)
            else:
                if p is not None:
                    self.deferred -= p[2] - p[1]
                    _madvise(p[0], p[1], p[2])
                p = self.pending[id(mm)] = [mm, b0, b1]
                self.deferred += b1 - b0
            if p[2] - p[1] >= RELEASE_SPAN:
                cut = p[2] if p[2] == len(mm) else p[2] // HUGE_PAGE * HUGE_PAGE
                if cut > p[1]:
                    _madvise(mm, p[1], cut)
                    self.deferred -= cut - p[1]
                    p[1] = cut
                    if cut == p[2]:  # nothing left waiting in this mapping
                        del self.pending[id(mm)]
            if self.deferred >= MAX_DEFERRED:
                self.flush()

    def flush(self) -> None:  # under self.lock
        for m, lo, hi in self.pending.values():
            _madvise(m, lo, hi)
        self.pending.clear()
        self.deferred = 0


_SCOPE: contextvars.ContextVar["_Scope | None"] = contextvars.ContextVar("tensordiff_files", default=None)


@contextlib.contextmanager
def shared_files():
    """Within this block, readers of the same file share one mapping of it (compare_dumps opens
    one around a whole comparison). Nested blocks share the outer one."""
    if _SCOPE.get() is not None:
        yield
        return
    scope = _Scope()
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        with scope.lock:
            scope.flush()


def _madvise(mm: mmap.mmap, b0: int, b1: int) -> None:
    try:
        mm.madvise(mmap.MADV_DONTNEED, b0, b1 - b0)
    except ValueError:  # a mapping closed under us: nothing left to release
        pass


def _map_file(path: Path) -> mmap.mmap:
    scope = _SCOPE.get()
    maps = scope.maps if scope is not None else None
    if maps is not None:
        m = maps.get(path)
        if m is not None:
            maps.move_to_end(path)
            return m
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if maps is not None:
        maps[path] = m
        if len(maps) > MAX_SHARED_MAPS:
            maps.popitem(last=False)
    return m


class FlatReader:
    """Reads [start, stop) of the flattened tensor as raw storage elements."""

    def read(self, start: int, stop: int) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def release(self, start: int, stop: int) -> None:
        """Done with [start, stop): a reader may drop what it holds of those elements."""

    def close(self) -> None:
        pass


class _MemmapReader(FlatReader):
    """A tensor's elements as a view of its file's mapping (shared inside `shared_files()`)."""

    def __init__(self, t: StoredTensor):
        self.t = t
        self.mm: mmap.mmap | None = None
        self.scope = _SCOPE.get()  # releases are gathered here (worker threads see no context)
        if t.numel == 0:
            self.arr = np.zeros(0, dtype=t.dtype.storage)
            return
        try:
            self.mm = _map_file(t.file)
            self.arr = np.frombuffer(self.mm, dtype=t.dtype.storage, count=t.numel, offset=t.offset)
        except (OSError, ValueError) as e:  # missing, emptied or truncated since the dump was opened
            size = t.file.stat().st_size if t.file.is_file() else None
            what = f"HDF5 dataset {t.key!r}" if t.raw else f"tensor {t.key!r}"
            raise BadInput(f"{t.file}: {what} cannot be read (the file has {size} bytes, the tensor ends at "
                           f"byte {t.offset + t.nbytes}: {type(e).__name__}); the file is damaged") from None

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.arr[start:stop]

    def release(self, start: int, stop: int) -> None:
        # Unmap the pages of [start, stop) from this process (the page cache keeps them; a later
        # read faults them back in), so streaming a tensor larger than RAM keeps resident memory a
        # chunk or two deep instead of the whole mapping. Pages shared with a neighbouring tensor go
        # too: dropping a read-only file page loses nothing, a reader of it just faults it back.
        if self.mm is None:
            return
        isz = self.t.dtype.itemsize
        release_bytes(self.mm, self.t.offset + start * isz, self.t.offset + stop * isz, self.scope)

    def close(self) -> None:
        self.arr = None
        self.mm = None


def release_bytes(mm: mmap.mmap, lo: int, hi: int, scope: "_Scope | None") -> None:
    """Release the pages holding bytes [lo, hi) of a mapping: inside `shared_files()` gathered into
    the scope's extent of that mapping (released together), outside it at once."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    b0 = lo // mmap.PAGESIZE * mmap.PAGESIZE
    b1 = min(-(-hi // mmap.PAGESIZE) * mmap.PAGESIZE, len(mm))
    if b1 <= b0:
        return
    if scope is not None:
        scope.release(mm, b0, b1)
    else:
        _madvise(mm, b0, b1)


def mapped_address(path: Path) -> "tuple[mmap.mmap, np.ndarray, int] | None":
    """A file's mapping (shared inside `shared_files()`), a byte view that keeps it exported while
    held, and the address of its first byte; None when it cannot be mapped (missing, empty: a
    reader then names the damage)."""
    try:
        mm = _map_file(path)
        view = np.frombuffer(mm, dtype=np.uint8)
    except (OSError, ValueError):
        return None
    return mm, view, view.__array_interface__["data"][0]


def current_scope() -> "_Scope | None":
    return _SCOPE.get()


# What h5py raises for a damaged file or dataset (its own errors derive from these).
H5_ERRORS = (OSError, ValueError, TypeError, KeyError, RuntimeError)


def _h5_error(t: StoredTensor, e: Exception) -> BadInput:
    return BadInput(f"{t.file}: HDF5 dataset {t.key!r} cannot be read ({type(e).__name__}: {str(e)[:200]}); "
                    "the file is damaged")


class _H5Reader(FlatReader):
    def __init__(self, t: StoredTensor):
        import h5py

        self.t = t
        try:
            self.f = h5py.File(t.file, "r")
            self.ds = self.f[t.key]
        except H5_ERRORS as e:
            raise _h5_error(t, e) from None
        self.row = 1
        for s in t.shape[1:]:
            self.row *= s

    def read(self, start: int, stop: int) -> np.ndarray:
        try:
            return self._read(start, stop)
        except H5_ERRORS as e:
            raise _h5_error(self.t, e) from None

    def _read(self, start: int, stop: int) -> np.ndarray:
        if not self.t.shape:
            return np.asarray(self.ds[()]).reshape(1)[start:stop]
        if self.row == 0:
            return np.zeros(0, dtype=self.t.dtype.storage)
        r0, r1 = start // self.row, -(-stop // self.row)
        block = np.asarray(self.ds[r0:r1]).reshape(-1)
        base = r0 * self.row
        return block[start - base : stop - base].astype(self.t.dtype.storage, copy=False)

    def close(self) -> None:
        self.f.close()


# ----------------------------------------------------------------------------- safetensors

def read_safetensors_layout(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], dict]:
    """The structure of a safetensors header, whatever its dtypes: {key: (dtype, shape, start,
    end)} with absolute byte offsets, each entry's integers checked and its bytes inside the
    file. A checkpoint shard (FP8 weights, FP8 scales) is checked with this; a dump's tensors
    are read with `read_safetensors_header`. Raises BadInput naming the file and the fault."""
    try:
        size = path.stat().st_size
        f = open(path, "rb")
    except OSError as e:  # unreadable to this user, or a directory
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    with f:
        head = f.read(8)
        if len(head) < 8:
            raise BadInput(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise BadInput(f"{path}: corrupt or truncated safetensors header (claims {n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise BadInput(f"{path}: corrupt safetensors header ({e.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise BadInput(f"{path}: corrupt safetensors header (not an object)")
    meta = header.pop("__metadata__", None) or {}
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    data_start = 8 + n
    for key, info in header.items():
        try:
            dtype = info["dtype"]
            # integers only: int() would turn 2.5 into 2 and raise OverflowError on 1e309
            if not isinstance(dtype, str) or not all(type(x) is int for x in (*info["shape"], *info["data_offsets"])):
                raise ValueError("not integers")
            shape = tuple(info["shape"])
            b, e = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise BadInput(f"{path}: tensor {key!r} has an unreadable header entry") from None
        if any(s < 0 for s in shape) or b < 0 or e < b:
            raise BadInput(f"{path}: tensor {key!r} offsets do not match its shape and dtype")
        if data_start + e > size:
            raise BadInput(f"{path}: truncated: tensor {key!r} ends at byte {data_start + e}, file has {size}")
        out[key] = (dtype, shape, data_start + b, data_start + e)
    return out, meta


def read_safetensors_header(path: Path) -> tuple[dict[str, StoredTensor], dict]:
    """Parse and validate a safetensors header of tensors this toolkit compares (their dtypes
    known, their sizes matching their shapes); raises BadInput naming the file and the fault."""
    layout, meta = read_safetensors_layout(path)
    out: dict[str, StoredTensor] = {}
    for key, (dtype, shape, b, e) in layout.items():
        dt = BY_ST.get(dtype)
        if dt is None:
            raise BadInput(f"{path}: tensor {key!r} has an unreadable header entry (dtype {dtype[:20]!r})")
        t = StoredTensor(path, key, shape, dt, b)
        if e - b != t.nbytes:
            raise BadInput(f"{path}: tensor {key!r} offsets do not match its shape and dtype")
        out[key] = t
    return out, meta


def write_safetensors(path: Path, tensors: dict[str, tuple[np.ndarray, DType]], metadata: dict | None = None) -> None:
    """Write raw little-endian C-order arrays as one safetensors file."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for key, (arr, dt) in tensors.items():
        header[key] = {"dtype": dt.st, "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for arr, _ in tensors.values():
            f.write(np.ascontiguousarray(arr).data)


# ----------------------------------------------------------------------------- HDF5

def read_hdf5_entry(path: Path, key: str, dtype_name: str | None, handle=None) -> StoredTensor:
    """One dataset of an HDF5 file as a StoredTensor. `handle`: the file already open (h5py.File),
    so a dump of many datasets in one file opens it once (`open_dump`)."""
    import h5py

    try:
        if handle is not None:
            return _hdf5_entry(handle, path, key, dtype_name)
        with h5py.File(path, "r") as f:
            return _hdf5_entry(f, path, key, dtype_name)
    except H5_ERRORS as e:  # h5py reports a damaged file through any of these
        raise BadInput(f"{path}: not a readable HDF5 file ({type(e).__name__}: {str(e)[:200]})") from None


def plain_hdf5_entry(layout, key: str, dtype_name: str | None) -> StoredTensor | None:
    """One dataset as `read_hdf5_entry` gives it when that is a tensor read in place (`raw`),
    located from the file's own metadata (`hdf5_layout.Layout`, ~5 us against ~50 through h5py);
    None for every other case, which `read_hdf5_entry` then decides (and names the fault of)."""
    if dtype_name is None or dtype_name not in BY_NAME:  # its dtype attribute, or an unknown name
        return None
    plain = layout.dataset(key)
    dt = BY_NAME[dtype_name]
    if plain is None or plain.itemsize != dt.itemsize:
        return None
    nbytes = math.prod(plain.shape) * dt.itemsize
    if nbytes == 0 or plain.size != nbytes or plain.offset + nbytes > layout.size:
        return None  # the conditions `_hdf5_entry` puts on reading in place
    return StoredTensor(layout.path, key, plain.shape, dt, plain.offset, raw=True)


def _hdf5_entry(f, path: Path, key: str, dtype_name: str | None) -> StoredTensor:
    import h5py

    # The dataset through h5py's low-level API when the manifest gives its dtype (~30 us, against
    # ~95 for the high-level lookup, Dataset object and properties: opening a dump of thousands
    # of datasets is mostly this); a name it cannot open (missing, a group, damaged) takes the
    # high-level path, which names the fault as before.
    dsid = None
    if dtype_name is not None:
        try:
            dsid = h5py.h5d.open(f.id, key.encode("utf-8"))
        except (*H5_ERRORS, UnicodeError):
            dsid = None
    name = dtype_name
    if dsid is None:
        try:
            ds = f[key]  # one lookup (`key in f`, then f[key], walked the links twice)
        except H5_ERRORS:
            if key in f:  # there, but unreadable: raised again, as a damaged file
                raise
            ds = None
        if not isinstance(ds, h5py.Dataset):
            raise BadInput(f"{path}: no dataset {key!r}")
        # The manifest's dtype first: reading a variable-length string attribute of a damaged
        # file can loop forever inside libhdf5 (found by tests/fuzz), so the attribute is read
        # only when the manifest does not say, and only when it is a fixed-length string.
        if name is None and "dtype" in ds.attrs:
            aid = ds.attrs.get_id("dtype")
            if aid.dtype.kind != "S" or aid.shape not in ((), (1,)):
                raise BadInput(f"{path}:{key}: the dtype attribute is not a fixed-length string; "
                               "give the dtype in the manifest")
            name = np.asarray(ds.attrs["dtype"]).reshape(-1)[0].decode("ascii", "replace")
        dsid = ds.id
    stored = np.dtype(dsid.dtype)  # once: each .dtype asks libhdf5 again
    name = name or _np_to_name(stored)
    try:
        dt = by_name(str(name))
    except KeyError as e:
        raise BadInput(f"{path}:{key}: {e.args[0]}") from None
    if stored.itemsize != dt.itemsize:
        raise BadInput(f"{path}:{key}: stored as {stored}, which cannot hold {dt.name}")
    shape = tuple(int(s) for s in dsid.shape)
    st = StoredTensor(path, key, shape, dt)
    # Contiguous, unfiltered, little-endian, allocated and inside the file: its bytes are read
    # in place (mapped), with no h5py call (and no h5py lock) per chunk. (h5py's `chunks is None
    # and not compression`, asked of the creation property list once.)
    dcpl = dsid.get_create_plist()
    plain = dcpl.get_layout() != h5py.h5d.CHUNKED and dcpl.get_nfilters() == 0
    offset = dsid.get_offset() if plain and st.numel else None
    order = stored.byteorder
    little = order in "<|" or (order == "=" and sys.byteorder == "little")
    if offset is not None and little and stored.kind in "fiub" \
            and dsid.get_storage_size() == st.nbytes and offset + st.nbytes <= path.stat().st_size:
        st = StoredTensor(path, key, shape, dt, int(offset), raw=True)
    return st


def write_hdf5(path: Path, tensors: dict[str, tuple[np.ndarray, DType]]) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for key, (arr, dt) in tensors.items():
            ds = f.create_dataset(key, data=arr)
            ds.attrs["dtype"] = np.bytes_(dt.name)  # fixed-length: read without libhdf5's heap (see above)


def _np_to_name(d) -> str:
    for n, dt in (("float64", "<f8"), ("float32", "<f4"), ("float16", "<f2"), ("int64", "<i8"), ("int32", "<i4"),
                  ("int16", "<i2"), ("int8", "i1"), ("uint8", "u1"), ("bool", "?")):
        if np.dtype(d) == np.dtype(dt):
            return n
    raise BadInput(f"unsupported HDF5 element type {d}")


def file_kind(path: Path) -> str:
    suf = path.suffix.lower()
    if suf in SAFETENSORS_EXT:
        return "safetensors"
    if suf in HDF5_EXT:
        return "hdf5"
    if suf in PICKLE_EXT:
        raise BadInput(f"{path}: {suf} files may hold pickles; tensordiff never unpickles (use safetensors or HDF5)")
    raise BadInput(f"{path}: unknown tensor file type {suf!r} (expected .safetensors, .h5 or .hdf5)")


def write_text_atomic(path: str | Path, text: str, what: str) -> None:
    """Write a report file under a temporary name, then rename: a reader never sees half of it.
    `what` names the file in the one-line error ("the JSON report")."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"cannot write {what} to {p}: {e.strerror}") from None


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
