"""Where an HDF5 file's plain datasets lie, read from the file's own metadata, without libhdf5.

Opening a dump of thousands of small HDF5 datasets through h5py costs ~50 us a dataset (open it,
ask its type, space and creation properties: a libhdf5 call and a Python object each), five times
what a safetensors entry costs, though the bytes of a plain dataset are then mapped in place just
the same (`storage.StoredTensor.raw`). This reads the documented on-disk structures (the HDF5 File
Format Specification) that libhdf5 writes by default, over one mapping of the file:

- superblock version 0 or 1 at byte 0, 8-byte offsets and lengths, base address 0, no driver
  information; the end-of-file address it records is inside the file (else libhdf5 calls the
  file truncated);
- a root group of the original kind: a symbol table (version-1 B-tree of symbol nodes, local heap
  of names), its hard links;
- version-1 object headers (and their continuation blocks).

It answers only for the plain case: a dataset linked from the root group, with a simple dataspace,
a little-endian IEEE float or full-precision integer type, a contiguous allocated layout, and no
filter pipeline, external storage or shared (committed) messages. For anything else (another
superblock, a nested or soft link, a chunked or compact layout, a structure it does not know, any
damage it meets) it answers None, and the caller asks h5py as before, which names the fault.
Every read is bounds-checked and every walk bounded, so a damaged file cannot make it loop.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import NamedTuple

SIGNATURE = b"\x89HDF\r\n\x1a\n"
UNDEF = 0xFFFFFFFFFFFFFFFF  # an undefined address (8-byte offsets)
MAX_DEPTH = 32  # B-tree levels; a real group of millions of links needs fewer than 10
MAX_CHUNKS = 64  # object header continuation blocks of one object
MAX_RANK = 32  # libhdf5's H5S_MAX_RANK

# object header message types (File Format Specification, IV.A.2)
DATASPACE, LINK_INFO, DATATYPE, OLD_FILL, FILL, LINK, EXTERNAL, LAYOUT, GROUP_INFO, PIPELINE = (
    0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0xA, 0xB)
CONTINUATION, SYMBOL_TABLE = 0x10, 0x11
GROUP = (SYMBOL_TABLE, LINK_INFO, LINK, GROUP_INFO)  # libhdf5 takes an object with these for a group
NIL, ATTRIBUTE = 0x0, 0xC
# The message types read or passed over here: what libhdf5 writes for a plain dataset and a root
# group of symbol tables. Any other (modification times, comments, reference counts, filters,
# external files, newer group links, ...) leaves the object to libhdf5, which decodes some of
# them as it opens the object and refuses it when they are damaged.
KNOWN = frozenset((NIL, DATASPACE, DATATYPE, OLD_FILL, FILL, LAYOUT, ATTRIBUTE, CONTINUATION, SYMBOL_TABLE))
CONSTANT = 0x01  # the one message flag allowed here (libhdf5 sets it on types and fill values);
# any other (shared, unknown-type handling) means a structure this reader leaves to libhdf5
FREE_NULL = 1  # a local heap's free list that is empty

# IEEE types as the datatype message describes them: size -> (precision, exponent location and
# size, mantissa location and size, exponent bias)
IEEE = {2: (16, 10, 5, 0, 10, 15), 4: (32, 23, 8, 0, 23, 127), 8: (64, 52, 11, 0, 52, 1023)}

_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_MSG = struct.Struct("<HHB3x")  # type, data size, flags
_ENTRY = struct.Struct("<QQI4x16x")  # symbol table entry: name offset, object header, cache type
_OHDR = struct.Struct("<BxHII")  # v1 object header: version, messages, reference count, header size
_HEAP = struct.Struct("<4sB3xQQQ")  # local heap: signature, version, data size, free list, data address
_NODE = struct.Struct("<4sBBHQQ")  # v1 B-tree node: signature, type, level, entries, siblings
_TYPE = struct.Struct("<BBBBI")  # datatype message: class and version, 3 bytes of bit fields, size
_FLOAT = struct.Struct("<HHBBBBI")  # float properties: offset, precision, exponent, mantissa, bias
_FIXED = struct.Struct("<HH")  # integer properties: offset, precision
_DIMS = [struct.Struct(f"<{r}Q") for r in range(MAX_RANK + 1)]  # a dataspace's dimensions, by rank


class Unknown(Exception):
    """The structure is not the plain one this reader knows (or is damaged): ask libhdf5."""


class Plain(NamedTuple):  # a tuple: one per dataset of a dump, made in ~0.2 us
    """A dataset whose elements lie as they are at `offset` (absolute, in bytes)."""

    shape: tuple[int, ...]
    kind: str  # numpy's kind of the stored element: "f", "i" or "u"
    itemsize: int
    offset: int
    size: int  # bytes of storage the layout records


class Layout:
    """One HDF5 file's root links, read once; `dataset(name)` locates one plain dataset."""

    def __init__(self, path: Path):
        self.path = path
        self.size = 0
        self.links: dict[str, int] = {}  # link name -> object header address (hard links only)
        self._mm: mmap.mmap | None = None
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.size = len(self._mm)
            self.links = self._root_links()
        except (OSError, ValueError, struct.error, Unknown, UnicodeError, IndexError):
            self.links = {}  # nothing known: every dataset goes to h5py

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def dataset(self, name: str) -> Plain | None:
        addr = self.links.get(name)
        if addr is None or self._mm is None:
            return None
        try:
            return self._plain(addr)
        except (ValueError, struct.error, Unknown, IndexError):
            return None

    # ------------------------------------------------------------------------- structures

    def _addr(self, a: int, n: int) -> int:
        """`a`, checked to start `n` bytes inside the file."""
        if a == UNDEF or a + n > self.size:
            raise Unknown(f"address {a} outside the file")
        return a

    def _root_links(self) -> dict[str, int]:
        mm = self._mm
        if mm[:8] != SIGNATURE:
            raise Unknown("no superblock at byte 0")  # a user block before it: libhdf5 finds it
        version = mm[8]
        # the format versions of its parts (free space, root entry, shared headers) are 0 as
        # libhdf5 requires; 8-byte offsets and lengths; no status flags; both B-tree Ks set
        if version not in (0, 1) or mm[9] or mm[10] or mm[12] or mm[13] != 8 or mm[14] != 8:
            raise Unknown("superblock versions or offset sizes")
        self.leaf_k, self.node_k, flags = struct.unpack_from("<HHI", mm, 16)
        if not self.leaf_k or not self.node_k or flags or (version == 1 and not _U16.unpack_from(mm, 24)[0]):
            raise Unknown("superblock B-tree sizes or status flags")
        p = 24 if version == 0 else 28
        base, extension, eof, driver = struct.unpack_from("<QQQQ", mm, p)
        if base != 0 or extension != UNDEF or driver != UNDEF or eof > self.size:
            raise Unknown("base address, extension, driver information or a truncated file")
        self.size = eof  # libhdf5 reads nothing beyond the end the superblock records
        _, root, cache = _ENTRY.unpack_from(mm, p + 32)
        if cache not in (0, 1):
            raise Unknown("the root entry is not a group")
        stab = [m for m in self._messages(root) if m[0] == SYMBOL_TABLE]
        if len(stab) != 1 or stab[0][2] < 16:
            raise Unknown("the root group is not a symbol table")
        btree, heap = struct.unpack_from("<QQ", mm, stab[0][1])
        sig, hv, dsize, free, daddr = _HEAP.unpack_from(mm, self._addr(heap, _HEAP.size))
        if sig != b"HEAP" or hv != 0:
            raise Unknown("local heap")
        names = (self._addr(daddr, dsize), dsize)
        self._free_list(names, free)
        links: dict[str, int] = {}
        self._walk(btree, names, links, set(), 0, None, None)
        return links

    def _free_list(self, names: tuple[int, int], block: int) -> None:
        """The heap's free blocks lie inside it, as libhdf5 checks when it loads the heap."""
        heap, hsize = names
        for _ in range(hsize // 16 + 1):
            if block == FREE_NULL:
                return
            if block + 16 > hsize:
                raise Unknown("a free block outside the heap")
            nxt, size = struct.unpack_from("<QQ", self._mm, heap + block)
            if nxt == 0 or block + size > hsize:
                raise Unknown("a damaged free list")
            block = nxt
        raise Unknown("a free list that loops")

    def _name(self, names: tuple[int, int], off: int) -> bytes:
        heap, hsize = names
        if off >= hsize:
            raise Unknown("a link name outside the heap")
        end = self._mm.find(b"\0", heap + off, heap + hsize)
        if end < 0:
            raise Unknown("a link name without its end")
        return self._mm[heap + off:end]

    def _walk(self, node: int, names: tuple[int, int], links: dict[str, int], seen: set[int], depth: int,
              lo: bytes | None, hi: bytes | None) -> None:
        """The group B-tree under `node`: every symbol node's hard links into `links`. libhdf5 finds
        a name by binary search (child i holds the names in (key i, key i+1], a symbol node its
        names in order), so a link is taken only where that search would find it too: keys and
        names strictly increasing, each inside its bounds (`lo`, `hi`: the parent's keys)."""
        if node in seen or depth > MAX_DEPTH:
            raise Unknown("a B-tree that loops")
        seen.add(node)
        mm = self._mm
        # libhdf5 reads a node whole, at the size its K gives (2K children), used or not
        sig, kind, level, used, _, _ = _NODE.unpack_from(mm, self._addr(node, _NODE.size + 32 * self.node_k + 8))
        if sig != b"TREE" or kind != 0 or used > 2 * self.node_k:
            raise Unknown("not a group B-tree node")
        p = node + _NODE.size
        self._addr(p, 16 * used + 8)
        keys = [self._name(names, _U64.unpack_from(mm, p + 16 * i)[0]) for i in range(used + 1)]
        if any(a >= b for a, b in zip(keys, keys[1:])) or (lo is not None and keys[0] < lo) \
                or (hi is not None and keys[-1] > hi):
            raise Unknown("B-tree keys out of order")
        for i in range(used):  # key i, child i, ..., key n
            (child,) = _U64.unpack_from(mm, p + 16 * i + 8)
            if level > 0:
                self._walk(child, names, links, seen, depth + 1, keys[i], keys[i + 1])
            else:
                self._symbols(child, names, links, seen, keys[i], keys[i + 1])

    def _symbols(self, node: int, names: tuple[int, int], links: dict[str, int], seen: set[int],
                 lo: bytes, hi: bytes) -> None:
        if node in seen:
            raise Unknown("a symbol node named twice")
        seen.add(node)
        mm = self._mm
        self._addr(node, 8 + 2 * self.leaf_k * _ENTRY.size)  # read whole, as a B-tree node
        (n,) = _U16.unpack_from(mm, node + 6)
        if mm[node:node + 4] != b"SNOD" or mm[node + 4] != 1 or n > 2 * self.leaf_k:
            raise Unknown("not a symbol table node")
        self._addr(node + 8, n * _ENTRY.size)
        last = lo
        for i in range(n):
            off, header, cache = _ENTRY.unpack_from(mm, node + 8 + i * _ENTRY.size)
            raw = self._name(names, off)
            if not last < raw <= hi or cache not in (0, 1, 2):
                raise Unknown("symbol names out of order, or an unknown entry")
            last = raw
            if cache in (0, 1):  # a hard link (2: a soft link, whose target h5py resolves)
                links[raw.decode("utf-8")] = header

    def _messages(self, addr: int) -> list[tuple[int, int, int]]:
        """A version-1 object header's messages: (type, data address, data size). Written for
        speed (a dump opens one header per dataset): the checks inlined, flags and types each
        one comparison (flags: CONSTANT at most; types: KNOWN)."""
        mm, limit = self._mm, self.size
        if addr + 16 > limit:
            raise Unknown("an object header outside the file")
        version, count, _, hsize = _OHDR.unpack_from(mm, addr)
        if version != 1:
            raise Unknown("not a version-1 object header")
        unpack, known = _MSG.unpack_from, KNOWN
        chunks, out, seen = [(addr + 16, hsize)], [], set()
        while chunks:
            start, length = chunks.pop()
            if start in seen or len(seen) >= MAX_CHUNKS or start + length > limit:
                raise Unknown("object header chunks outside the file, or that loop")
            seen.add(start)
            p, end = start, start + length
            while p < end:
                kind, size, flags = unpack(mm, p)
                p += 8
                if p + size > end or size & 7 or flags > CONSTANT or kind not in known:
                    raise Unknown("a message beyond its object header, unaligned, or left to libhdf5")
                if kind == CONTINUATION:
                    chunks.append(struct.unpack_from("<QQ", mm, p))
                out.append((kind, p, size))
                p += size
        if len(out) != count:
            raise Unknown("an object header with another number of messages than it says")
        return out

    def _plain(self, addr: int) -> Plain | None:
        shape = dtype = place = None
        for kind, data, size in self._messages(addr):
            if kind == DATASPACE:
                if shape is not None:
                    return None
                shape = self._dataspace(data, size)
            elif kind == DATATYPE:
                if dtype is not None:
                    return None
                dtype = self._datatype(data, size)
            elif kind == LAYOUT:
                if place is not None:
                    return None
                place = self._layout(data, size)
            elif kind in (FILL, OLD_FILL):
                if not self._fill(kind, data, size):
                    return None
            elif kind in (PIPELINE, EXTERNAL) or kind in GROUP:
                return None  # filtered, stored outside the file, or a group
        if shape is None or dtype is None or place is None:
            return None
        return Plain(shape, dtype[0], dtype[1], place[0], place[1])

    def _dataspace(self, p: int, size: int) -> tuple[int, ...] | None:
        mm = self._mm
        version, rank, flags = mm[p], mm[p + 1], mm[p + 2]
        if version == 1:
            first = p + 8
        elif version == 2:
            if mm[p + 3] != (1 if rank else 0):  # simple, or scalar (2: null, no elements at all)
                return None
            first = p + 4
        else:
            return None
        if rank > MAX_RANK or flags & ~0x01 or first + 8 * rank * (1 + (flags & 1)) > p + size:
            return None
        dims = _DIMS[rank].unpack_from(mm, first)
        if flags & 1:  # maximum dimensions: libhdf5 refuses a dimension beyond its maximum
            top = _DIMS[rank].unpack_from(mm, first + 8 * rank)
            if any(d > m for d, m in zip(dims, top) if m != UNDEF):
                return None
        return dims

    def _fill(self, kind: int, p: int, size: int) -> bool:
        """A fill value message libhdf5 decodes (it does, opening the dataset): version, flags and
        the value's size inside the message."""
        mm = self._mm
        if kind == OLD_FILL:
            return size >= 4 and 4 + _U32.unpack_from(mm, p)[0] <= size
        version = mm[p]
        if version in (1, 2):
            if size < 4 or mm[p + 1] > 3 or mm[p + 2] > 2 or mm[p + 3] > 1:
                return False
            have = version == 1 or mm[p + 3]
            head = p + 4
        elif version == 3:
            flags = mm[p + 1]
            if flags & 0xC0 or flags & 0x03 == 0 or (flags >> 2) & 0x03 > 2:
                return False
            have = flags & 0x20
            head = p + 2
        else:
            return False
        if not have:
            return True
        return head + 4 <= p + size and head + 4 + _U32.unpack_from(mm, head)[0] <= p + size

    def _datatype(self, p: int, size: int) -> tuple[str, int] | None:
        """(numpy kind, item size) of a little-endian IEEE float or full-width integer."""
        mm = self._mm
        cv, b0, b1, _, n = _TYPE.unpack_from(mm, p)
        cls, version = cv & 0x0F, cv >> 4
        if version not in (1, 2, 3) or b0 & 0x01 or b0 & 0x40:  # big-endian or VAX order
            return None
        if cls == 1 and n in IEEE and size >= 8 + _FLOAT.size:  # floating point
            off, prec, eloc, esize, mloc, msize, bias = _FLOAT.unpack_from(mm, p + 8)
            ok = (off == 0 and (prec, eloc, esize, mloc, msize, bias) == IEEE[n] and b1 == prec - 1
                  and not b0 & 0x0E and (b0 >> 4) & 0x03 == 2)  # no padding, implied leading 1
            return ("f", n) if ok else None
        if cls == 0 and n in (1, 2, 4, 8) and size >= 8 + _FIXED.size:  # fixed point
            off, prec = _FIXED.unpack_from(mm, p + 8)
            if off != 0 or prec != 8 * n or b0 & 0x06:
                return None
            return ("i" if b0 & 0x08 else "u", n)
        return None

    def _layout(self, p: int, size: int) -> tuple[int, int] | None:
        """(absolute offset, bytes) of allocated contiguous storage."""
        mm = self._mm
        if mm[p] not in (3, 4) or mm[p + 1] != 1 or size < 18:  # versions 3, 4; class 1: contiguous
            return None
        addr, n = struct.unpack_from("<QQ", mm, p + 2)
        if addr in (UNDEF, 0):  # not written yet; at byte 0 (the superblock): h5py's get_offset fails
            return None
        return addr, n
