"""FloatMetrics against a whole-array reference written from the documented definitions:
chunked, split over sibling accumulators (worker threads), numpy path and native kernel."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tensordiff.judge import metrics as M
from tensordiff.format.dtypes import BY_NAME, narrower
from tensordiff.judge.native import float_kernel
from tensordiff.judge.tolerance import DEFAULTS

NATIVE = float_kernel() is not None
MIN_EXP = {"float64": -1022, "float32": -126, "float16": -14, "bfloat16": -126}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def stored(x: np.ndarray, name: str) -> np.ndarray:
    return bf16_bits(x) if name == "bfloat16" else x.astype(BY_NAME[name].storage)


def widen(raw: np.ndarray, name: str, work) -> np.ndarray:
    if name == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(work)
    return raw.astype(work)


def reference(ra, rb, na, nb, shape):
    """Every metric of one tensor pair from whole arrays, straight from the definitions."""
    unit = narrower(BY_NAME[na], BY_NAME[nb])
    tol = DEFAULTS[unit.name]
    work = np.float64 if "float64" in (na, nb) else np.float32
    a, b = widen(ra, na, work), widen(rb, nb, work)
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    same = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b)))
    bad = ~both & ~same
    with np.errstate(all="ignore"):
        d = np.abs(a - b)  # in the work precision
    x, y, dd = a[both], b[both], d[both]
    x64, y64, d64 = x.astype(np.float64), y.astype(np.float64), dd.astype(np.float64)
    ax = np.abs(x)
    with np.errstate(all="ignore"):
        rel = dd / np.maximum(ax, np.finfo(work).tiny)
        viol = int((dd > work(tol.atol) + work(tol.rtol) * ax).sum())
        e = np.where(ax > 0, np.frexp(ax.astype(np.float64))[1] - 1, MIN_EXP[unit.name])
        sp = np.ldexp(1.0, np.maximum(e, MIN_EXP[unit.name]) - unit.bits_mantissa).astype(work)
        u = dd / sp
    nrm_a, nrm_b = math.sqrt(float(x64 @ x64)), math.sqrt(float(y64 @ y64))
    cos = 1.0 if nrm_a == nrm_b == 0 else (0.0 if 0 in (nrm_a, nrm_b) else float(x64 @ y64) / (nrm_a * nrm_b))
    full = np.where(both, d, 0).astype(np.float64)
    rows = full.reshape(shape[0], -1).max(axis=1) if len(shape) >= 2 and full.size else None
    worst = int(np.argmax(bad)) if bad.any() else (int(np.flatnonzero(both)[np.argmax(dd)]) if dd.size else -1)
    k = max(dd.size, 1)
    return {
        "numel": a.size, "max_abs": math.inf if bad.any() else (float(dd.max()) if dd.size else 0.0),
        "mean_abs": float(d64.sum()) / k, "rmse": math.sqrt(float(d64 @ d64) / k), "cosine": cos,
        "max_rel": float(rel.max()) if dd.size else 0.0, "mismatches": viol + int(bad.sum()),
        "nonfinite_mismatch": int(bad.sum()), "ulp_max": float(u.max()) if dd.size else 0.0,
        "nan": {"a": int(np.isnan(a).sum()), "b": int(np.isnan(b).sum())},
        "inf": {"a": int(np.isinf(a).sum()), "b": int(np.isinf(b).sum())},
        "range": {"a": [float(x.min()), float(x.max())], "b": [float(y.min()), float(y.max())]} if dd.size else None,
        "_u": u.astype(np.float64), "_worst": worst, "_rows": rows,
    }


def streamed(ra, rb, na, nb, shape, step, native: bool):
    da, db = BY_NAME[na], BY_NAME[nb]
    unit = narrower(da, db)
    acc = M.FloatMetrics(da, db, unit, DEFAULTS[unit.name], shape)
    sib = acc.spawn()
    for m in (acc, sib):
        if not native:
            m._native = None
    for j, s in enumerate(range(0, ra.size, step)):  # alternate chunks, as two workers would
        (acc, sib)[j % 2].update(s, ra[s : s + step], rb[s : s + step])
    acc.merge(sib)
    return acc


def make_case(seed: int, na: str, nb: str, nonfinite: bool, rows: int = 37, cols: int = 53):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(rows * cols) * 3).astype(np.float32)
    b = (a * (1 + 1e-3 * rng.standard_normal(a.size))).astype(np.float32)
    a[rng.integers(0, a.size, 5)] = 0.0
    b[7] = a[7] + 0.5  # one planted large difference
    if nonfinite:
        a[[3, 100, 200]] = [np.nan, np.inf, -np.inf]
        b[[3, 100, 200, 300]] = [np.nan, np.inf, np.inf, np.nan]  # matching, matching, sign flip, one-sided
    return stored(a, na), stored(b, nb), (rows, cols)


PAIRS = [("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16"),
         ("float16", "float32"), ("float64", "float32"), ("bfloat16", "float64"), ("float16", "float16")]


def check(res: dict, acc, ref: dict, rel_sums: float) -> None:
    for k in ("numel", "mismatches", "nonfinite_mismatch", "nan", "inf", "max_abs", "max_rel", "ulp_max"):
        assert res[k] == ref[k], (k, res[k], ref[k])
    if ref["range"] is not None:
        assert res["range"] == ref["range"]
    for k in ("mean_abs", "rmse"):
        assert res[k] == pytest.approx(ref[k], rel=rel_sums, abs=1e-300)
    assert res["cosine"] == pytest.approx(ref["cosine"], abs=1e-9)
    assert acc.worst == ref["_worst"]
    if ref["_rows"] is not None:
        np.testing.assert_array_equal(acc.rows, ref["_rows"])
    u = ref["_u"]
    for q in (0.5, 0.99):
        true = float(np.quantile(u, q, method="inverted_cdf"))
        got = res[f"ulp_p{round(q * 100)}"]
        assert got >= true - 1e-12, (q, got, true)  # an upper bound of the bin holding it
        assert got <= max(true * 1.05, true + 0.25) + 1e-12, (q, got, true)


@pytest.mark.parametrize("na,nb", PAIRS)
@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("step", [1, 64, 500, 10_000])
def test_numpy_path_matches_reference(na, nb, nonfinite, step):
    ra, rb, shape = make_case(step + len(na), na, nb, nonfinite)
    acc = streamed(ra, rb, na, nb, shape, step, native=False)
    check(acc.result(), acc, reference(ra, rb, na, nb, shape), 1e-12)


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
@pytest.mark.parametrize("na,nb", PAIRS[:4])
@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("step", [1, 700, 5000, 10_000])
def test_native_kernel_matches_reference(na, nb, nonfinite, step):
    ra, rb, shape = make_case(step, na, nb, nonfinite, rows=61, cols=97)  # > 1 kernel block per chunk
    acc = streamed(ra, rb, na, nb, shape, step, native=True)
    assert acc._native is not None
    check(acc.result(), acc, reference(ra, rb, na, nb, shape), 1e-6)


def test_identical_tensors_are_exact_and_a_one_ulp_change_is_one_ulp():
    a = np.linspace(-3, 3, 1001, dtype=np.float32)
    for native in (False, True):
        r = streamed(a, a.copy(), "float32", "float32", (1001,), 256, native).result()
        assert r["max_abs"] == 0 and r["cosine"] == 1.0 and r["sqnr_db"] == math.inf and r["ulp_max"] == 0
        b = a.copy()
        b[500 + 17] = np.nextafter(b[517], np.float32(np.inf))
        acc = streamed(a, b, "float32", "float32", (1001,), 256, native)
        assert acc.worst == 517 and acc.result()["ulp_max"] == 1.0 and acc.result()["mismatches"] == 0


def test_cosine_stays_accurate_near_one():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(200_000).astype(np.float32)
    b = (a * (1 + 1e-6 * rng.standard_normal(a.size))).astype(np.float32)
    ref = reference(a, b, "float32", "float32", (a.size,))
    for native in (False, True):
        cos = streamed(a, b, "float32", "float32", (a.size,), 65536, native).result()["cosine"]
        assert abs((1 - cos) - (1 - ref["cosine"])) <= 1e-2 * (1 - ref["cosine"]) + 1e-14  # 1 - cos ~ 5e-13


def test_key_table_bins_agree_with_the_log_formula_below_the_cells_edges():
    # linear bins below 16 ULP are exact; above, a value lands in its own bin or the one below
    u = np.concatenate([np.arange(0, 16, 1 / 64), np.geomspace(16, 1e30, 5000)]).astype(np.float32)
    want = M._ulp_bins(u.astype(np.float64))
    got = M._LUT[u.view(np.uint32) >> M._KEY_SHIFT].astype(np.int64)
    assert np.array_equal(got[u < 16], want[u < 16])
    assert np.all((got == want) | (got == want - 1))
    assert np.all(u.astype(np.float64) <= M._UPPER[got])  # bin uppers stay upper bounds


def test_numpy_path_splits_large_chunks_without_changing_results(monkeypatch):
    ra, rb, shape = make_case(11, "bfloat16", "float32", True)
    ref = reference(ra, rb, "bfloat16", "float32", shape)
    monkeypatch.setattr(M, "_NUMPY_STEP", 97)  # sub-steps that cut rows and blocks anywhere
    acc = streamed(ra, rb, "bfloat16", "float32", shape, 1000, native=False)
    check(acc.result(), acc, ref, 1e-12)


def _stored_pair(tmp_path, a: np.ndarray, b: np.ndarray, dt: str):
    from tensordiff.format.storage import read_safetensors_header, write_safetensors

    out = []
    for side, x in (("a", a), ("b", b)):
        p = tmp_path / f"{side}.safetensors"
        write_safetensors(p, {"t": (x, BY_NAME[dt])})
        out.append(read_safetensors_header(p)[0]["t"])
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_stream_pair_threads_give_the_sequential_answer(tmp_path, workers):
    from tensordiff.judge.stream import stream_pair

    rng = np.random.default_rng(3)
    ids_a = np.argsort(rng.random((4000, 16)), axis=1)[:, :4].astype(np.int32)
    ids_b = ids_a.copy()
    ids_b[[5, 1700, 3999]] = ids_b[[5, 1700, 3999]][:, ::-1]  # same sets, other order
    ids_b[2500, 0] = 15 if ids_b[2500, 0] != 15 else 14  # a different set
    sa, sb = _stored_pair(tmp_path, ids_a, ids_b, "int32")
    topk = stream_pair(sa, sb, M.TopKSetMetrics(4, DEFAULTS["int"]), 400, workers=workers)
    assert (topk.rows, topk.diff_rows, topk.first) == (4000, 1, 2500 * 4)
    exact = stream_pair(sa, sb, M.ExactMetrics(BY_NAME["int32"], BY_NAME["int32"]), 400, workers=workers)
    assert exact.first == 5 * 4 and exact.diff == int((ids_a != ids_b).sum())

    a = rng.standard_normal((300, 1000)).astype(np.float32)
    b = a + np.float32(1e-3) * (rng.random(a.shape) < 0.01)
    b[123, 456] = np.nan
    sa, sb = _stored_pair(tmp_path, a, b, "float32")
    acc = M.FloatMetrics(BY_NAME["float32"], BY_NAME["float32"], BY_NAME["float32"], DEFAULTS["float32"], a.shape)
    acc = stream_pair(sa, sb, acc, 7000, workers=workers)
    check(acc.result(), acc, reference(a, b, "float32", "float32", a.shape), 1e-6)
    assert acc.worst == 123 * 1000 + 456


def test_stream_pair_reraises_a_worker_error(tmp_path):
    from tensordiff.judge.stream import stream_pair

    sa, sb = _stored_pair(tmp_path, np.zeros(10_000, np.float32), np.zeros(10_000, np.float32), "float32")

    class Boom:
        def update(self, start, a, b):
            if start >= 5000:
                raise ValueError("planted")

        def spawn(self):
            return Boom()

        def merge(self, other):
            pass

    with pytest.raises(ValueError, match="planted"):
        stream_pair(sa, sb, Boom(), 1000, workers=2)


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


def test_release_drops_pages_and_later_reads_still_see_the_data(tmp_path):
    n = 8 << 20  # 32 MB of float32
    a = np.arange(n, dtype=np.float32)
    sa, _ = _stored_pair(tmp_path, a, a[:1], "float32")
    del a
    r = sa.reader()
    try:
        before = _rss_mb()
        assert float(r.read(0, n).max()) == n - 1  # every page touched: resident in this process
        touched = _rss_mb()
        r.release(0, n)  # the mapping's pages go; the file's bytes do not
        released = _rss_mb()
        assert touched - before > 24 and touched - released > 24, (before, touched, released)
        assert r.read(n - 3, n).tolist() == [n - 3, n - 2, n - 1]
    finally:
        r.close()


def test_exact_mode_on_floats_compares_values_not_truncated_integers():
    from tensordiff.format.dtypes import BY_NAME
    from tensordiff.judge.metrics import ExactMetrics

    f32, bf16 = BY_NAME["float32"], BY_NAME["bfloat16"]
    a = np.array([0.5, 1.25, np.nan], np.float32)
    acc = ExactMetrics(f32, f32)
    acc.update(0, a, a.copy())
    assert not acc.verdict()[0]  # equal, NaN included
    acc = ExactMetrics(f32, f32)
    acc.update(0, a, a + np.float32(1e-7))  # an integer cast would call these equal
    assert acc.verdict()[0] and acc.result().mismatches == 2 and 0 < acc.result().max_abs < 1e-6
    bits = (a.view(np.uint32) >> 16).astype(np.uint16)  # the same values stored as bf16 bits
    acc = ExactMetrics(f32, bf16)
    acc.update(0, a, bits)
    assert not acc.verdict()[0]


# ----------------------------------------------------------------------------- the histogram's bins

def edge_case(seed: int, n: int = 20_000):
    """Random pairs with every awkward value: NaN, +-Inf, -0, subnormals, the smallest normal,
    the largest floats (differences that overflow), exact ties and large relative errors."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32)
    b = (a * (1 + 10.0 ** rng.integers(-8, 0, n) * rng.standard_normal(n))).astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 3e-39, tiny, -tiny, 3.4e38, -3.4e38,
                         1.0, 16.0, 15.999999], dtype=np.float32)
    for x in (a, b):
        pos = rng.integers(0, n, 600)
        x[pos] = rng.choice(specials, 600)
    b[:50] = a[:50]  # exact ties
    b[50:100] = -a[50:100]
    return a, b


def old_bins(u32: np.ndarray) -> np.ndarray:
    """The histogram as the comparator counted it before the kernel counted bins: per key of u's
    float32 bits, folded into bins through `_LUT`."""
    return np.bincount(M._LUT[u32.view(np.uint32) >> M._KEY_SHIFT], minlength=M._NBINS)


@pytest.mark.parametrize("na,nb", PAIRS[:4] + [("float32", "float64"), ("float16", "float32")])
@pytest.mark.parametrize("seed", [0, 1])
def test_histogram_and_percentiles_are_the_key_tables_exactly(na, nb, seed):
    a, b = edge_case(seed)
    ra, rb = stored(a, na), stored(b, nb)
    ref = reference(ra, rb, na, nb, (a.size,))
    want = old_bins(ref["_u"].astype(np.float32))
    native_ok = NATIVE and {na, nb} <= {"float32", "bfloat16"}
    for native in (False, True) if native_ok else (False,):
        acc = streamed(ra, rb, na, nb, (a.size,), 3001, native)
        assert (acc._native is not None) == native
        np.testing.assert_array_equal(acc.hist, want)
        r = acc.result()  # a difference overflowing float32 (3.4e38 - -3.4e38) must not break a result
        assert r["ulp_max"] == ref["ulp_max"] and r["mismatches"] == ref["mismatches"]
        for q in (0.5, 0.99):
            assert r[f"ulp_p{round(q * 100)}"] == min(M._bin_upper(int(np.searchsorted(np.cumsum(want),
                                                                                     math.ceil(q * want.sum())))),
                                                      ref["ulp_max"])
    if native_ok:  # both paths: the same percentiles to the bit
        r0 = streamed(ra, rb, na, nb, (a.size,), 3001, False).result()
        r1 = streamed(ra, rb, na, nb, (a.size,), 3001, True).result()
        assert (r0.ulp_p50, r0.ulp_p99, r0.ulp_max) == (r1.ulp_p50, r1.ulp_p99, r1.ulp_max)


def test_the_bin_formula_is_the_key_table_for_every_key():
    # every key's lower edge and the last float of its cell, through the numpy mirror and the kernel
    keys = np.arange(M._NKEYS, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        u = np.concatenate([keys << M._KEY_SHIFT, (keys << M._KEY_SHIFT) | 0xFFFF]).view(np.float32)
    want = np.concatenate([M._LUT, M._LUT]).astype(np.int64)
    assert np.array_equal(M._kernel_bins(u), want)
    if NATIVE:
        import ctypes

        lib = ctypes.CDLL(float_kernel.__globals__["_build"]().as_posix())
        out = np.zeros(u.size, dtype=np.uint16)
        lib.td_ulp_bins.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        lib.td_ulp_bins(u.ctypes.data, u.size, out.ctypes.data)
        assert np.array_equal(out.astype(np.int64), want)


def test_a_wrong_bin_is_caught():
    # the fault that proves the check above: one bin off for one key is not the key table
    bins = M._kernel_bins((np.arange(M._NKEYS, dtype=np.uint32) << M._KEY_SHIFT).view(np.float32)[:20_000])
    bins[17_000] += 1
    assert not np.array_equal(bins, M._LUT[:20_000])


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
def test_large_finite_values_whose_squares_overflow_float32_keep_the_double_sums():
    # |x| ~ 1e20: x*x overflows a float32 partial sum; the kernel's overflowed block goes to the
    # double path (as NaN/Inf blocks do), so sums, cosine and RMSE stay the numpy path's
    rng = np.random.default_rng(11)
    a = (rng.standard_normal(5000) * 1e20).astype(np.float32)
    b = (a * (1 + 1e-4 * rng.standard_normal(a.size))).astype(np.float32)
    ref = reference(a, b, "float32", "float32", (a.size,))
    acc = streamed(a, b, "float32", "float32", (a.size,), 3000, native=True)
    assert acc._native is not None
    r = acc.result()
    assert math.isfinite(r["cosine"]) and math.isfinite(r["rmse"])
    check(r, acc, ref, 1e-6)


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
def test_a_large_call_and_small_calls_count_the_same_histogram():
    # the kernel counts a large call in 4 interleaved sub-histograms and a small one in one:
    # both give the numpy path's bins
    rng = np.random.default_rng(3)
    a = rng.standard_normal(100_000).astype(np.float32)
    b = (a * (1 + 3e-6 * rng.standard_normal(a.size))).astype(np.float32)
    hists = [streamed(a, b, "float32", "float32", (a.size,), step, native).hist
             for step, native in ((100_000, True), (1000, True), (100_000, False))]
    assert hists[0].sum() == a.size and len(np.flatnonzero(hists[0])) > 50
    np.testing.assert_array_equal(hists[0], hists[1])
    np.testing.assert_array_equal(hists[0], hists[2])


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
def test_misaligned_and_strided_chunks_reach_the_kernel_as_aligned_copies():
    rng = np.random.default_rng(9)
    a = rng.standard_normal(3000).astype(np.float32)
    b = (a * (1 + 1e-3 * rng.standard_normal(a.size))).astype(np.float32)
    odd = np.frombuffer(b"\0\0" + b.tobytes(), dtype=np.float32, count=b.size, offset=2)  # 2-byte misaligned
    assert not odd.flags.aligned and np.array_equal(odd, b)
    wide = np.repeat(a, 2)[::2]  # every other element: not contiguous
    assert not wide.flags.c_contiguous
    ref = streamed(a, b, "float32", "float32", (a.size,), 1000, native=True).result()
    for xa, xb in ((a, odd), (wide, b)):
        assert streamed(xa, xb, "float32", "float32", (a.size,), 1000, native=True).result().as_json() == ref.as_json()


def _cut_case(kind: str, n: int = 60_000):
    rng = np.random.default_rng(11)
    a = (rng.standard_normal(n) * 2).astype(np.float32)
    if kind == "drift":  # the first chunks equal (every pair in bin 0), the rest a few ULP apart
        b = (a * (1 + 3e-6 * rng.standard_normal(n))).astype(np.float32)
        b[:20_000] = a[:20_000]
    else:
        b = (a * (1 + 1e-3 * rng.standard_normal(n))).astype(np.float32)
    if kind == "nonfinite":
        a[[10, 30_000]] = [np.nan, np.inf]
        b[[10, 30_000, 45_000]] = [np.nan, -np.inf, np.nan]
    return a, b


@pytest.mark.skipif(not NATIVE, reason="no C compiler here")
@pytest.mark.parametrize("na,nb", [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("kind", ["noise", "nonfinite"])
def test_a_large_tensor_counted_by_cuts_has_the_full_histograms_percentiles(monkeypatch, na, nb, kind):
    # past CUT_MIN only the first chunk counts every bin; the rest counts the pairs below a few
    # edges: every result equals the full histogram's, percentiles included
    monkeypatch.setattr(M, "CUT_MIN", 10_000)
    a, b = _cut_case(kind)
    ra, rb = stored(a, na), stored(b, nb)
    acc = streamed(ra, rb, na, nb, (a.size,), 4096, native=True)
    assert acc._cut_pairs > 0 and acc.exact_percentiles()  # the cut path ran, and settled both
    full = M.FloatMetrics(BY_NAME[na], BY_NAME[nb], narrower(BY_NAME[na], BY_NAME[nb]),
                          DEFAULTS[narrower(BY_NAME[na], BY_NAME[nb]).name], (a.size,), full_histogram=True)
    for s in range(0, a.size, 4096):
        full.update(s, ra[s : s + 4096], rb[s : s + 4096])
    assert full._cut_pairs == 0
    got, want = acc.result(), full.result()
    for k in ("ulp_p50", "ulp_p99", "ulp_max", "numel", "mismatches", "max_abs", "max_rel"):
        assert got[k] == want[k], k
    check(got, acc, reference(ra, rb, na, nb, (a.size,)), 1e-6)


@pytest.mark.skipif(not NATIVE, reason="no C compiler here")
def test_percentiles_that_moved_past_the_cuts_are_not_guessed(monkeypatch):
    # the first chunks put p50 and p99 in bin 0; the rest moves them: the cuts cannot settle
    # them, result() refuses, and again() measures the tensor with the full histogram
    monkeypatch.setattr(M, "CUT_MIN", 10_000)
    a, b = _cut_case("drift")
    acc = streamed(a, b, "float32", "float32", (a.size,), 4096, native=True)
    assert acc._cut_pairs > 0 and not acc.exact_percentiles()
    with pytest.raises(RuntimeError, match="again"):
        acc.result()
    again = acc.again()
    for s in range(0, a.size, 4096):
        again.update(s, a[s : s + 4096], b[s : s + 4096])
    assert again.exact_percentiles() and again._cut_pairs == 0
    check(again.result(), again, reference(a, b, "float32", "float32", (a.size,)), 1e-6)


def test_the_cut_edges_bracket_each_first_estimate_and_its_nearer_neighbour():
    hist = np.zeros(M._NBINS, dtype=np.int64)
    hist[[10, 11, 12, 40]] = [30, 40, 29, 1]  # p50 in bin 11, low in its count (20 of 40); p99 in bin 12, high
    assert M._cuts_around(hist, (0.5, 0.99)).tolist() == [10, 11, 12, 13, 14]
    hist[:] = 0
    hist[0] = 100  # every pair in bin 0: edge 0 is known without counting; p99 leans up
    assert M._cuts_around(hist, (0.5, 0.99)).tolist() == [1, 2]
    assert M._cuts_around(np.zeros(M._NBINS, dtype=np.int64), (0.5,)) is None
