"""Streaming a pair of stored tensors chunk by chunk: bounded memory, a few worker threads.

Each worker takes the next chunk, reads it from both sides and feeds its own accumulator
(numpy and the native kernel release the GIL, so two workers keep two cores busy); the
accumulators are merged at the end. With `--verify`, one more thread per side hashes that side's
chunks in order beside them (SHA-256 is sequential within a tensor; hashlib releases the GIL).
After a chunk its pages are released from the process (the page cache keeps them) once no
consumer needs them, and no consumer runs more than WINDOW chunks ahead, so resident memory stays
a few chunks deep however large the tensor is. An accumulator has `update(start, a, b)`,
`spawn()` (an empty sibling) and `merge(sibling)`.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Callable

from tensordiff.format.storage import FlatReader, StoredTensor

CHUNK = 1 << 20  # elements per side per step: 4 MB of fp32; bounded whatever the tensor size, and few
# enough steps that per-chunk Python costs stay ~5% (the native kernel works in 1024-element blocks)
WORKERS = int(os.environ.get("TENSORDIFF_THREADS") or 0) or min(2, os.cpu_count() or 1)

Progress = Callable[[int], None]


def chunk_len(row: int) -> int:
    """Elements per step: CHUNK, rounded down to whole rows of `row` elements when rows are shorter."""
    if row <= 0 or row >= CHUNK:
        return CHUNK
    return max(row, (CHUNK // row) * row)


def release(reader: FlatReader, start: int, stop: int) -> None:
    rel = getattr(reader, "release", None)
    if rel is not None:
        rel(start, stop)


WINDOW = 2  # chunks in flight ahead of the slowest consumer: resident memory stays ~WINDOW + workers
# chunks a side (2 keeps two metric workers and a hash thread per side busy)


def _hash(h, x) -> None:
    h.update(memoryview(x).cast("B"))  # the stored bytes as they are: no copy (hashlib drops the GIL)


def stream_pair(sa: StoredTensor, sb: StoredTensor, acc, step: int, *, workers: int | None = None,
                progress: Progress | None = None, hashes: tuple | None = None):
    """Feed both tensors' elements [s, s+step) to `acc` for every chunk; returns `acc` with all
    chunks merged in. `hashes`: a pair of hashlib objects (or None) fed each side's bytes in order."""
    n = sa.numel
    workers = WORKERS if workers is None else workers
    ra, rb = sa.reader(), sb.reader()
    hashed = [(r, h) for r, h in zip((ra, rb), hashes) if h] if hashes and any(hashes) else []
    try:
        if n <= step or workers <= 1:
            for s in range(0, n, step):
                e = min(n, s + step)
                xa, xb = ra.read(s, e), rb.read(s, e)
                for r, h in hashed:
                    _hash(h, xa if r is ra else xb)
                acc.update(s, xa, xb)
                release(ra, s, e)
                release(rb, s, e)
                if progress:
                    progress(xa.nbytes + xb.nbytes)
            return acc
        return _parallel(ra, rb, n, step, acc, workers, progress, hashed)
    finally:
        ra.close()
        rb.close()


def _parallel(ra: FlatReader, rb: FlatReader, n: int, step: int, acc, workers: int, progress: Progress | None,
              hashed: list) -> object:
    """`workers` metric threads take chunks in turn, one thread per hashed side hashes its chunks in
    order, at the same time. A chunk's pages are released once every consumer of that side is done
    with it, and no consumer runs more than WINDOW chunks ahead of the slowest, so resident memory
    stays a few chunks deep whatever the tensor's size and however slow hashing is."""
    starts = list(range(0, n, step))
    accs = [acc] + [acc.spawn() for _ in range(workers - 1)]
    cond = threading.Condition()
    errors: list[BaseException] = []
    nxt = [0]  # next chunk a metric worker takes
    done = [False] * len(starts)  # metrics done per chunk
    low = [0]  # first chunk whose metrics are not done
    pos = {id(r): 0 for r, _ in hashed}  # chunks hashed, per hashed side
    readers = (ra, rb)

    def hash_low() -> int:
        return min(pos.values()) if pos else len(starts)

    def settle(i: int) -> None:  # under cond: release what no consumer needs any more
        s, e = starts[i], min(n, starts[i] + step)
        for r in readers:
            if done[i] and (id(r) not in pos or pos[id(r)] > i):
                release(r, s, e)

    def metrics(a) -> None:
        try:
            while True:
                with cond:
                    i = nxt[0]
                    if errors or i >= len(starts):
                        return
                    nxt[0] += 1
                    cond.wait_for(lambda: errors or i < hash_low() + WINDOW)
                    if errors:
                        return
                s = starts[i]
                e = min(n, s + step)
                xa, xb = ra.read(s, e), rb.read(s, e)
                a.update(s, xa, xb)
                with cond:
                    done[i] = True
                    while low[0] < len(starts) and done[low[0]]:
                        low[0] += 1
                    settle(i)
                    if progress:
                        progress(xa.nbytes + xb.nbytes)
                    cond.notify_all()
        except BaseException as exc:  # re-raised on the calling thread
            with cond:
                errors.append(exc)
                cond.notify_all()

    def hashing(r: FlatReader, h) -> None:
        try:
            for i, s in enumerate(starts):
                with cond:
                    cond.wait_for(lambda: errors or i < low[0] + WINDOW)
                    if errors:
                        return
                _hash(h, r.read(s, min(n, s + step)))
                with cond:
                    pos[id(r)] = i + 1
                    settle(i)
                    cond.notify_all()
        except BaseException as exc:
            with cond:
                errors.append(exc)
                cond.notify_all()

    threads = [threading.Thread(target=metrics, args=(a,), daemon=True) for a in accs[1:]]
    threads += [threading.Thread(target=hashing, args=rh, daemon=True) for rh in hashed]
    for t in threads:
        t.start()
    metrics(accs[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for other in accs[1:]:
        acc.merge(other)
    return acc


def sha256_pair(verify: bool, sha_a: str | None, sha_b: str | None) -> tuple:
    return (hashlib.sha256() if verify and sha_a else None, hashlib.sha256() if verify and sha_b else None)
