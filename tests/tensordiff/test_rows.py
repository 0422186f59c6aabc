"""Per-row error statistics: streamed in whole-row chunks, equal to the direct computation."""
import math

import numpy as np
import pytest

from tensordiff.judge.rows import RowErrors, shape_rows


def test_streamed_rows_equal_the_direct_computation():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(50, 12))
    b = a + rng.normal(scale=1e-3, size=a.shape)
    acc = RowErrors(50, 12)
    for s in range(0, a.size, 12 * 7):  # chunks of 7 rows, the last one short
        acc.update(s, a.ravel()[s:s + 84], b.ravel()[s:s + 84])
    d = b - a
    assert np.allclose(acc.row_rmse, np.sqrt((d * d).mean(axis=1)))
    assert np.allclose(acc.row_ref_rms, np.sqrt((a * a).mean(axis=1)))
    assert math.isclose(acc.rmse, float(np.sqrt((d * d).mean())), rel_tol=1e-12)
    cos = float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))
    assert math.isclose(acc.cosine_deficit, 1 - cos, rel_tol=1e-6)
    assert not acc.exact and acc.nonfinite == 0


def test_exact_and_nonfinite():
    a = np.arange(12.0)
    acc = RowErrors(3, 4)
    acc.update(0, a, a.copy())
    assert acc.exact and acc.rmse == 0 and acc.cosine_deficit == 0
    b = a.copy()
    b[5] = np.nan
    acc2 = RowErrors(3, 4)
    acc2.update(0, a, b)
    assert acc2.nonfinite == 1 and not acc2.exact


def test_chunks_must_hold_whole_rows():
    with pytest.raises(ValueError):
        RowErrors(3, 4).update(2, np.zeros(4), np.zeros(4))


def test_shape_rows():
    assert shape_rows((5, 3, 4)) == (5, 12)
    assert shape_rows((7,)) == (1, 7)
    assert shape_rows(()) == (1, 1)
