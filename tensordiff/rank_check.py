"""Checks between the ranks of a sharded dump, run on each boundary after its tensors are judged.

- Replicas (`"replicated": true`) must be bit for bit equal: an all-reduce leaves every rank the
  same bits, and ranks that computed a replicated value on their own computed it from the same
  inputs. Copies that differ are a divergence between ranks; the report names the ranks that
  disagree with the majority. With no majority (two ranks, or an even split) each copy is judged
  against the other side's tensor and the ranks whose copy diverges are named.
- A diverged tensor split along an axis: each rank's shard is judged against the other side's
  slice at its place, and at every other shard's place. A shard that matches another place is
  a shard in the wrong order, named with its rank; a lone diverged shard is named too.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .dump import Entry
from .shard import MergedTensor
from .storage import FlatReader
from .stream import CHUNK, release

MAX_ORDER_WORLD = 16  # the placement search judges W x W pairs: beyond this only each shard's own place


def check(br, judge, bd, ents_a: Mapping[str, Entry], ents_b: Mapping[str, Entry], run: dict,
          verify: bool = False) -> None:
    """Amend `br` (a BoundaryResult) with the rank checks of its sharded tensors, then re-settle it.
    `verify`: first check every rank's part against its own sha256 (a merged tensor has none)."""
    from .judge import settle

    touched = False
    for t in br.tensors:
        for side, ents, other in (("A", ents_a, ents_b), ("B", ents_b, ents_a)):
            e = ents.get(t.name)
            if e is None or not isinstance(e.stored, MergedTensor):
                continue
            if verify:
                verify_parts(e)
            if e.stored.kind == "replicated" and len(e.stored.parts) > 1:
                touched |= _replicas(t, side, e, other.get(t.name), judge, bd, run)
            elif e.stored.kind == "shard" and t.status == "diverged" and t.name in other:
                touched |= _placement(t, side, e, other[t.name], judge, bd, run)
    if touched:
        br.status, br.reason = settle(br.tensors)


def digest(stored) -> str:
    h = hashlib.sha256()
    r = stored.reader()
    try:
        for s in range(0, stored.numel, CHUNK):
            e = min(stored.numel, s + CHUNK)
            h.update(np.ascontiguousarray(r.read(s, e)).tobytes())
            release(r, s, e)
    finally:
        r.close()
    return h.hexdigest()


def parts_verified(e: Entry) -> tuple[bool, bool]:
    """(every rank's part of a merged tensor matches the sha256 its manifest gives, any was given)."""
    given = [p for p in e.stored.parts if p.sha256]
    return all(digest(p.stored) == p.sha256 for p in given), bool(given)


def verify_parts(e: Entry) -> None:
    from .errors import BadInput

    for p in e.stored.parts:
        if p.sha256 and digest(p.stored) != p.sha256:
            raise BadInput(f"{p.stored.file}: rank {p.rank}'s part of tensor {e.name!r} fails its sha256: "
                           "the file is corrupt")


def _judged(judge, bd, run, ref: Entry, cand, ref_side: str) -> bool:
    """Does `cand` (a stored tensor) match `ref` under the boundary's rule? `ref_side` says
    which side the reference entry is (the comparison keeps A as the reference)."""
    ce = Entry(ref.name, ref.boundary, cand, None)
    ea, eb = (ref, ce) if ref_side == "A" else (ce, ref)
    return judge.tensor(ea, eb, bd, run).status == "match"


def _replicas(t, side: str, e: Entry, ref: Entry | None, judge, bd, run) -> bool:
    groups: dict[str, list[int]] = {}
    for p in e.stored.parts:
        groups.setdefault(digest(p.stored), []).append(p.rank)
    if len(groups) == 1:
        return False
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    info = {"side": side, "groups": ordered}
    if len(ordered[0]) > len(ordered[1]):
        odd = sorted(r for g in ordered[1:] for r in g)
        info["disagree"] = odd
        why = (f"replicas differ between ranks (side {side}): rank{'s' if len(odd) > 1 else ''} "
               f"{_list(odd)} disagree{'s' if len(odd) == 1 else ''} with the majority, ranks {_list(ordered[0])}")
    else:
        why = f"replicas differ between ranks (side {side}) with no majority ({' | '.join(_list(g) for g in ordered)})"
        if ref is not None:
            parts = {p.rank: p for p in e.stored.parts}
            bad = [r for r in sorted(parts) if not _judged(judge, bd, run, ref, parts[r].stored, "B" if side == "A" else "A")]
            info["disagree"] = bad
            why += (f"; against the other side rank{'s' if len(bad) > 1 else ''} {_list(bad)} diverge{'s' if len(bad) == 1 else ''}"
                    if bad else "; every copy is within tolerance of the other side")
    t.ranks = info
    t.status = "diverged"
    t.reason = why + (f"; {t.reason}" if t.reason else "")
    return True


def _placement(t, side: str, e: Entry, ref: Entry, judge, bd, run) -> bool:
    m: MergedTensor = e.stored
    bounds = np.cumsum([0] + [p.stored.shape[m.axis] for p in m.parts]).tolist()
    if tuple(ref.shape) != tuple(m.shape):
        return False
    ref_side = "B" if side == "A" else "A"
    places = [(bounds[i], bounds[i + 1]) for i in range(len(m.parts))]
    own = [_judged(judge, bd, run, _place(ref, m.axis, *places[i]), p.stored, ref_side)
           for i, p in enumerate(m.parts)]
    if all(own):
        return False
    moved = []
    if len(m.parts) <= MAX_ORDER_WORLD:
        for i, p in enumerate(m.parts):
            if own[i]:
                continue
            for j, (lo, hi) in enumerate(places):
                if j != i and hi - lo == places[i][1] - places[i][0] and \
                        _judged(judge, bd, run, _place(ref, m.axis, lo, hi), p.stored, ref_side):
                    moved.append((p.rank, i, j))
                    break
    bad = sorted(p.rank for i, p in enumerate(m.parts) if not own[i])
    t.ranks = {"side": side, "disagree": bad, "misplaced": [{"rank": r, "index": i, "matches": j} for r, i, j in moved]}
    if moved:
        t.reason = ("shards in the wrong order (side " + side + "): " + "; ".join(
            f"rank {r}'s shard {i} matches the other side's slice {j}" for r, i, j in moved) + f"; {t.reason}")
    else:
        t.reason = (f"the divergence lies in the shard{'s' if len(bad) > 1 else ''} of rank{'s' if len(bad) > 1 else ''} "
                    f"{_list(bad)} (side {side}, axis {m.axis}); {t.reason}")
    return True


def _list(rs) -> str:
    return ", ".join(str(r) for r in rs)


def _place(ref: Entry, axis: int, lo: int, hi: int) -> Entry:
    return Entry(ref.name, ref.boundary, AxisSlice(ref.stored, axis, lo, hi), None)


@dataclass(frozen=True)
class AxisSlice:
    """Elements lo..hi-1 along `axis` of a stored (or merged) tensor, read lazily."""

    parent: object
    axis: int
    lo: int
    hi: int

    @property
    def shape(self) -> tuple[int, ...]:
        s = list(self.parent.shape)
        s[self.axis] = self.hi - self.lo
        return tuple(s)

    @property
    def dtype(self):
        return self.parent.dtype

    @property
    def file(self):
        return self.parent.file

    @property
    def key(self) -> str:
        return f"{self.parent.key}[axis {self.axis}: {self.lo}:{self.hi}]"

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def reader(self) -> FlatReader:
        return _SliceReader(self)


class _SliceReader(FlatReader):
    def __init__(self, s: AxisSlice):
        self.s = s
        self.r = s.parent.reader()
        self.inner = int(np.prod(s.parent.shape[s.axis + 1:], dtype=np.int64))
        self.prow = s.parent.shape[s.axis] * self.inner
        self.row = (s.hi - s.lo) * self.inner

    def read(self, start: int, stop: int) -> np.ndarray:
        if stop <= start or self.row == 0:
            return np.zeros(0, dtype=self.s.dtype.storage)
        o0, o1 = start // self.row, -(-stop // self.row)
        block = self.r.read(o0 * self.prow, o1 * self.prow).reshape(o1 - o0, self.prow)
        out = block[:, self.s.lo * self.inner:self.s.hi * self.inner].reshape(-1)
        base = o0 * self.row
        res = np.array(out[start - base:stop - base])
        release(self.r, o0 * self.prow, o1 * self.prow)
        return res

    def close(self) -> None:
        self.r.close()

