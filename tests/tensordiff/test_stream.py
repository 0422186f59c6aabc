"""Streaming a tensor pair: hashing beside the metric workers (--verify), the same answers on any
thread count, and a bounded window of chunks in flight however slow one consumer is."""
from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest

from tensordiff.judge import metrics as M
from tensordiff.judge import stream
from tensordiff.format.dtypes import BY_NAME
from tensordiff.format.storage import read_safetensors_header, write_safetensors
from tensordiff.judge.tolerance import DEFAULTS

F32 = BY_NAME["float32"]


def stored_pair(tmp_path, a: np.ndarray, b: np.ndarray):
    out = []
    for side, x in (("a", a), ("b", b)):
        p = tmp_path / f"{side}.safetensors"
        write_safetensors(p, {"t": (x, F32)})
        out.append(read_safetensors_header(p)[0]["t"])
    return out


def data(n: int = 50_000, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = (a * (1 + 1e-6 * rng.standard_normal(n))).astype(np.float32)
    return a, b


def acc_for(n: int) -> M.FloatMetrics:
    return M.FloatMetrics(F32, F32, F32, DEFAULTS["float32"], (n,))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_hashes_and_metrics_are_the_sequential_ones_on_any_thread_count(tmp_path, workers):
    a, b = data()
    sa, sb = stored_pair(tmp_path, a, b)
    want = stream.stream_pair(sa, sb, acc_for(a.size), 1000, workers=1).result()
    hs = (hashlib.sha256(), hashlib.sha256())
    got = stream.stream_pair(sa, sb, acc_for(a.size), 1000, workers=workers, hashes=hs).result()
    assert hs[0].hexdigest() == hashlib.sha256(a.tobytes()).hexdigest()
    assert hs[1].hexdigest() == hashlib.sha256(b.tobytes()).hexdigest()
    for k in ("max_abs", "max_rel", "ulp_p50", "ulp_p99", "ulp_max", "mismatches", "range"):
        assert got[k] == want[k], k
    assert got["mean_abs"] == pytest.approx(want["mean_abs"], rel=1e-12)


def test_one_side_hashed_alone(tmp_path):
    a, b = data()
    sa, sb = stored_pair(tmp_path, a, b)
    h = hashlib.sha256()
    stream.stream_pair(sa, sb, acc_for(a.size), 999, workers=2, hashes=(None, h))
    assert h.hexdigest() == hashlib.sha256(b.tobytes()).hexdigest()


def test_a_flipped_byte_mid_tensor_changes_the_hash(tmp_path):
    # the fault that proves the threaded hash: one byte in the middle of a many-chunk tensor
    a, b = data()
    b2 = b.copy()
    b2.view(np.uint8)[b2.nbytes // 2 + 1] ^= 0x01
    sa, sb = stored_pair(tmp_path, a, b2)
    h = hashlib.sha256()
    stream.stream_pair(sa, sb, acc_for(a.size), 1000, workers=2, hashes=(None, h))
    assert h.hexdigest() != hashlib.sha256(b.tobytes()).hexdigest()


class SlowHash:
    """A sha256 that takes its time: the metric workers must wait for it, not run ahead."""

    def __init__(self):
        self.h = hashlib.sha256()

    def update(self, x) -> None:
        time.sleep(0.002)
        self.h.update(x)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


@pytest.mark.parametrize("workers", [2, 3])
def test_chunks_in_flight_stay_within_the_window(tmp_path, monkeypatch, workers):
    a, b = data(60_000)
    sa, sb = stored_pair(tmp_path, a, b)
    live: dict[int, set[int]] = {}
    peak = [0]
    lock = threading.Lock()
    real_read = type(sa.reader()).read

    def read(self, s, e):
        with lock:
            live.setdefault(id(self), set()).add(s)
            peak[0] = max(peak[0], len(live[id(self)]))
        return real_read(self, s, e)

    def release(reader, s, e):
        with lock:
            live[id(reader)].discard(s)

    monkeypatch.setattr(type(sa.reader()), "read", read)
    monkeypatch.setattr(stream, "release", release)
    h = SlowHash()
    stream.stream_pair(sa, sb, acc_for(a.size), 1000, workers=workers, hashes=(h, None))
    assert h.hexdigest() == hashlib.sha256(a.tobytes()).hexdigest()
    assert all(not v for v in live.values()), "every chunk is released in the end"
    assert peak[0] <= stream.WINDOW + workers, peak[0]


def test_without_the_window_a_slow_hash_would_pile_chunks_up(tmp_path, monkeypatch):
    # the fault that proves the window check above: with the window opened, chunks pile up
    window = stream.WINDOW
    monkeypatch.setattr(stream, "WINDOW", 10_000)
    a, b = data(60_000)
    sa, sb = stored_pair(tmp_path, a, b)
    live: set[int] = set()
    peak = [0]
    lock = threading.Lock()

    def release(reader, s, e):
        with lock:
            if reader is not None:
                live.discard((id(reader), s))

    real_read = type(sa.reader()).read

    def read(self, s, e):
        with lock:
            live.add((id(self), s))
            peak[0] = max(peak[0], sum(1 for r, _ in live if r == id(self)))
        return real_read(self, s, e)

    monkeypatch.setattr(type(sa.reader()), "read", read)
    monkeypatch.setattr(stream, "release", release)
    stream.stream_pair(sa, sb, acc_for(a.size), 1000, workers=2, hashes=(SlowHash(), None))
    assert peak[0] > window + 2 + 8


def test_a_hashing_error_reaches_the_caller(tmp_path):
    a, b = data()
    sa, sb = stored_pair(tmp_path, a, b)

    class Broken:
        def update(self, x):
            raise ValueError("planted")

    with pytest.raises(ValueError, match="planted"):
        stream.stream_pair(sa, sb, acc_for(a.size), 1000, workers=2, hashes=(Broken(), None))
