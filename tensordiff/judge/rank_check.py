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

from tensordiff.format.dump import Entry
from tensordiff.format.shard import MergedTensor
from tensordiff.format.storage import FlatReader
from tensordiff.judge.stream import CHUNK, release
from tensordiff.errors import BadInput
from tensordiff.judge.judge import settle
from tensordiff.judge.metrics import FloatResult

MAX_ORDER_WORLD = 16  # the placement search judges W x W pairs: beyond this only each shard's own place


def check(br, judge, bd, ents_a: Mapping[str, Entry], ents_b: Mapping[str, Entry], run: dict,
          verify: bool = False) -> None:
    """Amend `br` (a BoundaryResult) with the rank checks of its sharded tensors, then re-settle it.
    `verify`: first check every rank's part against its own sha256 (a merged tensor has none)."""
    touched = False
    for t in br.tensors:
        for side, ents, other in (("A", ents_a, ents_b), ("B", ents_b, ents_a)):
            e = ents.get(t.name)
            if e is None or not isinstance(e.stored, MergedTensor):
                continue
            if verify:
                verify_parts(e)
            if e.stored.kind == "replicated" and len(e.stored.parts) > 1:
                touched |= _replicas(t, side, e, other.get(t.name), judge, bd, run, (ents_a, ents_b))
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
    for p in e.stored.parts:
        if p.sha256 and digest(p.stored) != p.sha256:
            raise BadInput(f"{p.stored.file}: rank {p.rank}'s part of tensor {e.name!r} fails its sha256: "
                           "the file is corrupt")


def definite(br) -> bool:
    """Whether a boundary's failure is a rank finding no upstream near-tie flip explains: replicas
    that differ (every rank computed them from the same inputs) or a shard that matches another
    place. `compare` never demotes such a boundary to a flip's cascade."""
    return any(t.status == "diverged" and t.ranks and (t.ranks.get("groups") or t.ranks.get("misplaced"))
               for t in br.tensors)


def rank_view(ents: Mapping[str, Entry], rank: int) -> dict[str, Entry]:
    """A boundary's entries as rank `rank` holds them: each replicated tensor its own copy
    (shards and partial sums stay merged: no rank holds them whole)."""
    out = dict(ents)
    for name, e in ents.items():
        if isinstance(e.stored, MergedTensor) and e.stored.kind == "replicated":
            part = next((p for p in e.stored.parts if p.rank == rank), None)
            if part is not None:
                out[name] = Entry(e.name, e.boundary, part.stored, part.sha256)
    return out


def _judged(judge, bd, run, ref: Entry, cand, ref_side: str, ents: tuple | None = None,
            rank: int | None = None) -> bool:
    """Does `cand` (a stored tensor) match `ref` under the boundary's rule? `ref_side` says
    which side the reference entry is (the comparison keeps A as the reference). With `ents`
    (both sides' entries of the boundary) and `rank`, the whole boundary as that rank holds it
    (`rank_view`) is judged, so the tie rule applies with the scores the rank itself ranked: a
    choice that flipped only on a near-tie agrees."""
    ce = Entry(ref.name, ref.boundary, cand, None)
    if ents is not None:
        ea, eb = (dict(ents[0]), rank_view(ents[1], rank)) if ref_side == "A" else (rank_view(ents[0], rank),
                                                                                    dict(ents[1]))
        (eb if ref_side == "A" else ea)[ref.name] = ce
        br = judge.boundary(bd, ea, eb, run)
        return next(t.status for t in br.tensors if t.name == ref.name) in ("match", "benign")
    ea, eb = (ref, ce) if ref_side == "A" else (ce, ref)
    return judge.tensor(ea, eb, bd, run).status == "match"


def _replicas(t, side: str, e: Entry, ref: Entry | None, judge, bd, run, ents: tuple) -> bool:
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
            bad = [r for r in sorted(parts)
                   if not _judged(judge, bd, run, ref, parts[r].stored, "B" if side == "A" else "A", ents, r)]
            info["disagree"] = bad
            why += (f"; against the other side rank{'s' if len(bad) > 1 else ''} {_list(bad)} diverge{'s' if len(bad) == 1 else ''}"
                    if bad else "; every copy is within tolerance of the other side")
    t.ranks = info
    t.status = "diverged"
    t.reason = why + (f"; {t.reason}" if t.reason else "")
    return True


PLACE_MARGIN = 0.5  # a shard resembles another place by this much more cosine than its own: misplaced


def _fit(judge, bd, run, ref: Entry, axis: int, lo: int, hi: int, cand, ref_side: str) -> tuple[bool, float | None]:
    """(does `cand` match the other side's slice lo..hi along `axis`, their cosine; None for integers)."""
    place, ce = _place(ref, axis, lo, hi), Entry(ref.name, ref.boundary, cand, None)
    ea, eb = (place, ce) if ref_side == "A" else (ce, place)
    res = judge.tensor(ea, eb, bd, run)
    return res.status == "match", (res.metrics.cosine if isinstance(res.metrics, FloatResult) else None)


def _placement(t, side: str, e: Entry, ref: Entry, judge, bd, run) -> bool:
    """A diverged tensor split along an axis: which ranks' shards diverge, and which sit at
    another place. A shard is misplaced when it matches another place, or (downstream of other
    error, where nothing matches) its cosine with another place beats its own by PLACE_MARGIN:
    a slice from elsewhere is uncorrelated with its own place, however close the rest is."""
    m: MergedTensor = e.stored
    if tuple(ref.shape) != tuple(m.shape):
        return False
    bounds = np.cumsum([0] + [p.stored.shape[m.axis] for p in m.parts]).tolist()
    places = [(bounds[i], bounds[i + 1]) for i in range(len(m.parts))]
    ref_side = "B" if side == "A" else "A"
    own = [_fit(judge, bd, run, ref, m.axis, *places[i], p.stored, ref_side) for i, p in enumerate(m.parts)]
    if all(ok for ok, _ in own):
        return False
    moved = []
    if len(m.parts) <= MAX_ORDER_WORLD:
        for i, p in enumerate(m.parts):
            ok_i, cos_i = own[i]
            if ok_i:
                continue
            best = None
            for j, (lo, hi) in enumerate(places):
                if j == i or hi - lo != places[i][1] - places[i][0]:
                    continue
                ok_j, cos_j = _fit(judge, bd, run, ref, m.axis, lo, hi, p.stored, ref_side)
                far_better = cos_j is not None and cos_i is not None and cos_j - cos_i > PLACE_MARGIN
                if (ok_j or far_better) and (best is None or (ok_j, cos_j or 0) > best[1:]):
                    best = (j, ok_j, cos_j or 0)
            if best is not None:
                moved.append({"rank": p.rank, "index": i, "matches": best[0], "cosine_own": cos_i,
                              "cosine_there": best[2] if best[2] else None})
    bad = sorted(p.rank for i, p in enumerate(m.parts) if not own[i][0])
    t.ranks = {"side": side, "disagree": bad, "misplaced": moved}
    if moved:
        t.reason = ("shards in the wrong order (side " + side + "): " + "; ".join(
            f"rank {x['rank']}'s shard {x['index']} " + ("matches" if x["cosine_there"] is None or
                                                         x["cosine_own"] is None else "resembles")
            + f" the other side's slice {x['matches']}" for x in moved) + f"; {t.reason}")
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

