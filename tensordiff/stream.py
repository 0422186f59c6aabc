"""Streaming a pair of stored tensors chunk by chunk: bounded memory, a few worker threads.

Each worker takes the next chunk, reads it from both sides and feeds its own accumulator
(numpy and the native kernel release the GIL, so two workers keep two cores busy); the
accumulators are merged at the end. After a chunk its pages are released from the process
(the page cache keeps them), so resident memory stays a few chunks deep however large the
tensor is. An accumulator has `update(start, a, b)`, `spawn()` (an empty sibling) and
`merge(sibling)`.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Callable

from .storage import FlatReader, StoredTensor

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


def stream_pair(sa: StoredTensor, sb: StoredTensor, acc, step: int, *, workers: int | None = None,
                progress: Progress | None = None, hashes: tuple | None = None):
    """Feed both tensors' elements [s, s+step) to `acc` for every chunk; returns `acc` with all
    chunks merged in. `hashes` (a pair of hashlib objects or None) needs the chunks in order, so
    it runs on one thread."""
    n = sa.numel
    workers = WORKERS if workers is None else workers
    ra, rb = sa.reader(), sb.reader()
    try:
        if workers <= 1 or n <= step or (hashes and any(hashes)):
            for s in range(0, n, step):
                e = min(n, s + step)
                xa, xb = ra.read(s, e), rb.read(s, e)
                for h, x in zip(hashes or (), (xa, xb)):
                    if h:
                        h.update(x.tobytes())
                acc.update(s, xa, xb)
                release(ra, s, e)
                release(rb, s, e)
                if progress:
                    progress(xa.nbytes + xb.nbytes)
            return acc
        accs = [acc] + [acc.spawn() for _ in range(workers - 1)]
        starts = iter(range(0, n, step))
        lock = threading.Lock()
        errors: list[BaseException] = []

        def work(a) -> None:
            try:
                while not errors:
                    with lock:
                        s = next(starts, None)
                    if s is None:
                        return
                    e = min(n, s + step)
                    xa, xb = ra.read(s, e), rb.read(s, e)
                    a.update(s, xa, xb)
                    release(ra, s, e)
                    release(rb, s, e)
                    if progress:
                        with lock:
                            progress(xa.nbytes + xb.nbytes)
            except BaseException as exc:  # re-raised on the calling thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(a,), daemon=True) for a in accs[1:]]
        for t in threads:
            t.start()
        work(accs[0])
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        for other in accs[1:]:
            acc.merge(other)
        return acc
    finally:
        ra.close()
        rb.close()


def sha256_pair(verify: bool, sha_a: str | None, sha_b: str | None) -> tuple:
    return (hashlib.sha256() if verify and sha_a else None, hashlib.sha256() if verify and sha_b else None)
