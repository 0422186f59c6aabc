"""Reading a stored tensor as rows: any order, bounded chunks; the diagnosis of a tensor larger
than its chunks never holds the tensor."""
from __future__ import annotations

import tracemalloc

import numpy as np
from conftest import rand, write

from tensordiff.judge.diagnosis.matrix import SAMPLE_ELEMENTS, Matrix, sample_rows
from tensordiff.judge.diagnosis.run import diagnose_tensor
from tensordiff.format.dump import open_dump


def test_take_returns_rows_in_the_order_asked(tmp_path):
    a = rand(50, 7)
    d = open_dump(write(tmp_path / "a", {"x": a}, {}))
    with Matrix(d.entry("x").stored) as m:
        idx = np.array([9, 3, 4, 5, 49, 3, 0])
        assert np.array_equal(m.take(idx), a[idx].astype(np.float64))
        spans = list(m.chunks())
        assert spans[0][0] == 0 and spans[-1][1] == 50 and all(x[1] == y[0] for x, y in zip(spans, spans[1:]))


def test_a_sample_is_bounded_in_elements_and_seeded():
    assert np.array_equal(sample_rows(10_000), sample_rows(10_000))
    assert sample_rows(10, 4).tolist() == list(range(10))
    assert sample_rows(10_000, 100_000).size * 100_000 <= max(8 * 100_000, SAMPLE_ELEMENTS)


def test_diagnosing_a_large_tensor_streams_it(tmp_path):
    n, c = 1 << 17, 128  # 64 MB of float32 per side, 128 MB each as float64
    a = rand(n, c)
    b = np.roll(a, 5, axis=0)
    da = open_dump(write(tmp_path / "a", {"x": a}, {}))
    db = open_dump(write(tmp_path / "b", {"x": b}, {}))
    del a, b
    tracemalloc.start()
    try:
        found = diagnose_tensor("x", da.entry("x").stored, db.entry("x").stored, "plain", {})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found[0].name == "shift" and found[0].explained > 0.999
    assert peak < 80e6, peak  # a few 8 MB chunks of float64, never the 2 x 128 MB of the tensors
