"""The native kernel's two paths (tensordiff/judge/native/float_metrics.c): the AVX-512 intrinsics
blocks against the generic loop and the numpy reference, its bins for every key, and the proven
error bound of its float sums."""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from tensordiff.judge import metrics as M
from tensordiff.judge import native
from tensordiff.format.dtypes import BY_NAME, narrower
from tensordiff.judge.tolerance import DEFAULTS

from test_metrics_streaming import edge_case, reference, stored, streamed

NATIVE = native.float_kernel() is not None
WIDE = NATIVE and native.set_generic(False)
needs_wide = pytest.mark.skipif(not WIDE, reason="no AVX-512 here: only the generic path is built")
U = 2.0 ** -24  # float32 unit roundoff
SUM_BOUND = 15 * U  # float_metrics.c, block_avx512: at most G1 + G2 - 1 = 15 float roundings per term


@pytest.fixture
def path():
    """path(generic) switches the kernel's path; the AVX-512 path is restored afterwards."""
    yield native.set_generic
    native.set_generic(False)


def _vec_bins(u: np.ndarray) -> np.ndarray:
    lib = native.library()
    f = lib.td_ulp_bins_vec
    f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    f.restype = ctypes.c_int
    out = np.zeros(u.size, dtype=np.uint16)
    assert f(u.ctypes.data, u.size, out.ctypes.data) == 1
    return out.astype(np.int64)


@needs_wide
def test_the_vector_bins_are_the_key_table_for_every_key():
    keys = np.arange(M._NKEYS, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        u = np.concatenate([keys << M._KEY_SHIFT, (keys << M._KEY_SHIFT) | 0xFFFF]).view(np.float32)
    np.testing.assert_array_equal(_vec_bins(u), np.concatenate([M._LUT, M._LUT]).astype(np.int64))


@needs_wide
def test_a_wrong_vector_bin_is_caught():
    # the fault that proves the check above: the bins of the keys, one moved, are not the table
    u = (np.arange(M._NKEYS, dtype=np.uint32) << M._KEY_SHIFT).view(np.float32)[:30_000]
    bins = _vec_bins(u)
    assert np.array_equal(bins, M._LUT[:30_000])
    bins[25_000] += 1
    assert not np.array_equal(bins, M._LUT[:30_000])


SUM_KEYS = ("mean_abs", "rmse", "cosine", "sqnr_db")


@needs_wide
@pytest.mark.parametrize("na,nb", [("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16"),
                                   ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_avx512_path_gives_the_generic_paths_values(path, na, nb, seed):
    # NaN, +-Inf, -0, subnormals, overflowing differences, ties; rows; chunks that cut blocks and
    # vectors (the tails go to the generic block)
    a, b = edge_case(seed, n=20_000 + 13 * seed)
    ra, rb = stored(a, na), stored(b, nb)
    shape = (a.size // 7, 7) if a.size % 7 == 0 else (a.size,)
    got = {}
    for generic in (True, False):
        assert path(generic) == (not generic)
        acc = streamed(ra, rb, na, nb, shape, 3001, native=True)
        got[generic] = (acc.result().as_json(), acc.hist.copy(), acc.worst,
                        None if acc.rows is None else acc.rows.copy())
    (r0, h0, w0, rows0), (r1, h1, w1, rows1) = got[True], got[False]
    np.testing.assert_array_equal(h0, h1)
    assert w0 == w1
    if rows0 is not None:
        np.testing.assert_array_equal(rows0, rows1)
    assert {k: v for k, v in r0.items() if k not in SUM_KEYS} == {k: v for k, v in r1.items() if k not in SUM_KEYS}
    ref = reference(ra, rb, na, nb, shape)
    for r in (r0, r1):
        for k in ("mean_abs", "rmse"):
            assert r[k] == pytest.approx(ref[k], rel=2e-6)
    # the cosine from the sums (1 - (|d|^2 - (|a| - |b|)^2) / (2 |a| |b|)) is accurate near 1, not
    # on this data with differences of 1e38; the two paths' sums still agree
    assert r0["cosine"] == pytest.approx(r1["cosine"], abs=1e-6)


def _sums(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float]:
    """sum |d|, d^2, a^2, b^2 over the pairs, exactly (float32 d; squares exact in double; fsum)."""
    d = np.abs(a - b).astype(np.float64)
    x, y = a.astype(np.float64), b.astype(np.float64)
    return tuple(math.fsum(t.tolist()) for t in (d, d * d, x * x, y * y))


def _kernel_sums(a: np.ndarray, b: np.ndarray) -> tuple[float, ...]:
    acc = M.FloatMetrics(BY_NAME["float32"], BY_NAME["float32"], BY_NAME["float32"], DEFAULTS["float32"], (a.size,))
    acc.update(0, a, b)
    return tuple(float(acc.D[j]) for j in (M._SUM_ABS, M._SUM_SQ_ERR, M._SUM_SQ_A, M._SUM_SQ_B))


def adversarial(seed: int, n: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """Terms over 40 decades (squares stay below FLT_MAX per block), runs of equal values, a huge
    value ahead of many tiny ones in one lane, signed zeros, subnormals, blocks of equal pairs.
    Seed 3: absorption, each block's first square 1 and then 1023 squares of 2^-24 (half an ULP
    of 1: a float running sum drops every one of them)."""
    if seed == 3:
        a = np.full(n, 2.0 ** -12, dtype=np.float32)
        a[::1024] = 1.0
        return a, np.zeros(n, dtype=np.float32)
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 17, n)).astype(np.float32)
    b = (a * (1 + 10.0 ** rng.integers(-7, 0, n) * rng.standard_normal(n))).astype(np.float32)
    a[1000:3000] = np.float32(1.0 + 2 ** -23)  # runs of one value: every rounding the same way
    b[1000:3000] = np.float32(1.0)
    a[4096:4096 + 1024:16] = np.float32(3e16)  # one lane: a huge term first, then tiny ones
    a[4096 + 16:4096 + 1024] = np.where(np.arange(1024 - 16) % 16 == 0, np.float32(1e-3), a[4096 + 16:4096 + 1024])
    a[8000:8100] = -0.0
    b[8000:8100] = 0.0
    a[9000:9050] = np.float32(1e-45)
    b[9000:9050] = np.float32(-3e-39)
    b[12288:12288 + 2048] = a[12288:12288 + 2048]  # equal blocks
    return a, b


@needs_wide
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_float_sums_stay_within_the_proven_bound(seed):
    a, b = adversarial(seed)
    double = (a.size // 1024 + 16) * 2.0 ** -53  # the blocks' double additions
    for got, exact in zip(_kernel_sums(a, b), _sums(a, b)):
        assert abs(got - exact) <= (SUM_BOUND + double) * exact + 1e-300, (got, exact, abs(got - exact) / exact)


def test_the_sum_bound_check_catches_a_worse_summation():
    # the fault that proves the check above on the same data: one float32 running sum over each
    # 1024-element block (a chain per block, the order a scalar loop would take) breaks the bound
    a, b = adversarial(3)
    x2 = (a.astype(np.float64) ** 2).astype(np.float32)
    worse = sum(float(np.cumsum(x2[i:i + 1024], dtype=np.float32)[-1]) for i in range(0, a.size, 1024))
    exact = _sums(a, b)[2]
    assert abs(worse - exact) > SUM_BOUND * exact


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
@pytest.mark.parametrize("generic", [True, False])
def test_a_difference_whose_square_overflows_float32_keeps_the_double_sums(path, generic):
    # one pair a block of |a|, |b| = 1.2e19: their squares' sums fit a float (2.9e38), d^2 = 5.8e38
    # does not; the block must go to the double path (once it reported rmse = inf, SQNR -inf dB)
    path(generic)
    rng = np.random.default_rng(8)
    a = rng.standard_normal(4096).astype(np.float32)
    b = (a * (1 + 1e-4 * rng.standard_normal(a.size))).astype(np.float32)
    a[::1024], b[::1024] = 1.2e19, -1.2e19
    ref = reference(a, b, "float32", "float32", (a.size,))
    acc = streamed(a, b, "float32", "float32", (a.size,), 4096, native=True)
    r = acc.result()
    assert math.isfinite(r.rmse) and r.rmse == pytest.approx(ref["rmse"], rel=1e-6)
    assert math.isfinite(r.sqnr_db)


@needs_wide
def test_a_block_with_a_nan_counts_its_bins_once(path):
    # the AVX-512 block counts its bins as it goes; a NaN found at its end sends the block to the
    # scalar path, which counts them again: the first counts must come off
    rng = np.random.default_rng(4)
    a = rng.standard_normal(1 << 14).astype(np.float32)
    b = (a * (1 + 1e-5 * rng.standard_normal(a.size))).astype(np.float32)
    b[[700, 5000, 5001, 9999]] = [np.nan, np.inf, -np.inf, np.nan]
    want = streamed(a, b, "float32", "float32", (a.size,), 1 << 14, native=False).hist
    acc = streamed(a, b, "float32", "float32", (a.size,), 1 << 14, native=True)
    np.testing.assert_array_equal(acc.hist, want)
    assert acc.hist.sum() == a.size - 4


def test_status_names_the_path(path):
    if not NATIVE:
        assert native.set_generic(True) is False
        return
    path(True)
    assert native.status == "native (generic)"
    path(False)
    assert native.status == ("native (AVX-512)" if WIDE else "native (generic)")


@needs_wide
@pytest.mark.parametrize("kind", ["few ulp", "far", "far, narrow", "shifting", "equal"])
def test_large_calls_count_hot_bins_in_registers_and_the_rest_exactly(path, kind):
    # a call of >= 16 * NBINS elements counts its first block's 8 commonest bins (below 127) in
    # vector registers and the rest by scalar increments; the counts are the numpy path's whatever
    # the distribution does after that first block
    rng = np.random.default_rng(12)
    n = 200_003
    a = rng.standard_normal(n).astype(np.float32)
    rel = {"few ulp": 2e-7, "far": 1e-3, "shifting": 2e-7, "equal": 0.0, "far, narrow": 0.0}[kind]
    b = (a * (1 + rel * rng.standard_normal(n))).astype(np.float32)
    if kind == "far, narrow":  # ~8,000 ULP, a few bins: the register-counted window starts far above 0
        b = (a * (1 + 1e-3 * (1 + 0.002 * rng.standard_normal(n)))).astype(np.float32)
    if kind == "shifting":  # the first block's hot bins are rare later on
        b[5000:] = (a[5000:] * (1 + 1e-5 * rng.standard_normal(n - 5000))).astype(np.float32)
        b[150_000:] = a[150_000:]
    want = streamed(a, b, "float32", "float32", (n,), n, native=False)
    for generic in (False, True):
        path(generic)
        acc = streamed(a, b, "float32", "float32", (n,), n, native=True)
        np.testing.assert_array_equal(acc.hist, want.hist)
        r, w = acc.result(), want.result()
        assert (r.ulp_p50, r.ulp_p99, r.ulp_max, r.max_rel, r.mismatches) == (w.ulp_p50, w.ulp_p99, w.ulp_max,
                                                                               w.max_rel, w.mismatches)


def _cpu_runs(march: str) -> bool:
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    need = {"skylake-avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl"), "haswell": ("avx2", "fma", "bmi2"),
            "x86-64": ()}[march]
    return all(f" {f}" in flags for f in need)


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
@pytest.mark.parametrize("march", ["skylake-avx512", "haswell", "x86-64"])
def test_the_kernel_built_for_other_cpus_gives_the_same_values(tmp_path, march):
    # the kernel is built with -march=native where it runs; a CI machine without AVX-512 VBMI (no
    # register-counted bins), without AVX-512 (the generic loop only) or without AVX2 must count the
    # same: built here for those targets (where this CPU can run them), against the numpy path
    import os
    import platform
    import shutil
    import subprocess

    if platform.machine() not in ("x86_64", "AMD64") or not _cpu_runs(march):
        pytest.skip(f"this CPU cannot run -march={march}")
    cc = shutil.which(os.environ.get("CC") or "cc")
    so = tmp_path / f"k-{march}.so"
    flags = [f"-march={march}" if f == "-march=native" else f for f in native.FLAGS]
    subprocess.run([cc, *flags, "-o", str(so), str(native.SOURCE)], check=True, capture_output=True, timeout=120)
    f = ctypes.CDLL(str(so)).td_float_update
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    f.argtypes = [p, ctypes.c_int, p, ctypes.c_int, i64, i64, f32, f32, f32, f32, p, i64, p, i64, i64, p, p]
    rng = np.random.default_rng(2)
    x2 = rng.standard_normal(120_000).astype(np.float32)
    for x, y in (edge_case(0, n=120_000), (x2, (x2 * (1 + 2e-7 * rng.standard_normal(x2.size))).astype(np.float32))):
        ref = streamed(x, y, "float32", "float32", (x.size,), x.size, native=False)
        acc = M.FloatMetrics(ref.da, ref.db, ref.unit, ref.tol, (x.size,))
        base = acc._store.ctypes.data
        assert f(x.ctypes.data, 0, y.ctypes.data, 0, x.size, 0, acc.tol.effective_atol, acc.tol.rtol, acc._floor_f32,
                 float(acc._scale), base + 22 * 8, M._NBINS, None, 0, 0, base, base + 80) == 0
        np.testing.assert_array_equal(acc.hist, ref.hist)
        np.testing.assert_array_equal(acc.I, ref.I)
        for j in (M._MAX_ABS, M._MAX_REL, M._MIN_A, M._MAX_A, M._MIN_B, M._MAX_B, M._ULP_MAX):
            assert acc.D[j] == ref.D[j], j
        for j in (M._SUM_ABS, M._SUM_SQ_ERR, M._SUM_SQ_A, M._SUM_SQ_B):
            assert acc.D[j] == pytest.approx(ref.D[j], rel=2e-6), j


@pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernel is not built here")
@pytest.mark.parametrize("generic", [True, False])
@pytest.mark.parametrize("cols,step", [(2048, 3 * 2048), (5120, 5120), (2048, 3001), (1500, 4500)])
def test_row_maxima_whether_a_block_lies_in_one_row_or_straddles(path, generic, cols, step):
    # a block inside one row takes the block's max as the row's; one that straddles rows scans them
    path(generic)
    rng = np.random.default_rng(cols + step)
    a = rng.standard_normal(40 * cols).astype(np.float32)
    b = (a * (1 + 1e-4 * rng.standard_normal(a.size))).astype(np.float32)
    b[rng.integers(0, a.size, 30)] += 3.0  # row maxima that differ from row to row
    ref = reference(a, b, "float32", "float32", (40, cols))
    acc = streamed(a, b, "float32", "float32", (40, cols), step, native=True)
    np.testing.assert_array_equal(acc.rows, ref["_rows"])


@needs_wide
def test_the_benchmarks_no_histogram_switch_drops_only_the_histogram():
    # bench/compare_throughput.py's kernel_nohist route: every other statistic as always, and no
    # bin counted by the AVX-512 blocks (only the generic tail's); off again, the histogram is back
    a, b = adversarial(0)
    shape = (a.size,)

    def run():
        acc = M.FloatMetrics(BY_NAME["float32"], BY_NAME["float32"], BY_NAME["float32"], DEFAULTS["float32"], shape)
        acc.update(0, a, b)
        return acc.I.copy(), acc.D.copy(), acc.hist.copy()

    i0, d0, h0 = run()
    try:
        assert native.set_no_hist(True)
        i1, d1, h1 = run()
    finally:
        assert not native.set_no_hist(False)
    i2, d2, h2 = run()
    assert h0.sum() == a.size and h1.sum() == 0
    np.testing.assert_array_equal(i0, i1)
    np.testing.assert_array_equal(d0, d1)
    np.testing.assert_array_equal(h2, h0)


def _cuts_call(a, ka, b, kb, cuts):
    """td_float_update_cuts on one call: (its counters and accumulators, the counts below each cut)."""
    f = native.float_cuts()
    store = M.STORE0.copy()
    base = store.ctypes.data
    c = np.array(cuts, dtype=np.int32)
    below = np.zeros(len(cuts), dtype=np.int64)
    rc = f(a.ctypes.data, ka, b.ctypes.data, kb, a.size, 0, 1e-5, 1.3e-6, 2.0 ** -126, 2.0 ** -23, M._NBINS, None, 0, 0,
           base, base + 80, c.ctypes.data, c.size, below.ctypes.data)
    return rc, store[:22], below


def _hist_call(a, ka, b, kb):
    store = M.STORE0.copy()
    base = store.ctypes.data
    assert native.float_kernel()(a.ctypes.data, ka, b.ctypes.data, kb, a.size, 0, 1e-5, 1.3e-6, 2.0 ** -126, 2.0 ** -23,
                                 base + 22 * 8, M._NBINS, None, 0, 0, base, base + 80) == 0
    return store[:22], store[22:]


@pytest.mark.skipif(not NATIVE, reason="no C compiler here")
@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cut_counts_are_the_histograms_counts_below_each_edge(path, generic, seed):
    # the cut mode's counts of u below each edge's least u against the histogram of the same call:
    # the edges of the linear and log parts, the last finite bins, the u = Inf bin, and the bins
    # the data fills (adversarial: 40 decades, NaN/Inf, subnormals, equal blocks; bf16 either side)
    path(generic)
    a, b = adversarial(seed)
    b = b.copy()
    b[[5, 7000, 20000]] = [np.nan, np.inf, -np.inf]
    a[30000:30016], b[30000:30016] = 3e38, -3e38  # |a - b| overflows: u = Inf
    a16, b16 = (a.view(np.uint32) >> 16).astype(np.uint16), (b.view(np.uint32) >> 16).astype(np.uint16)
    for (x, kx), (y, ky) in [((a, 0), (b, 0)), ((a16, 1), (b, 0)), ((a, 0), (b16, 1))]:
        stats, hist = _hist_call(x, kx, y, ky)
        filled = np.flatnonzero(hist)
        edges = sorted({1, 2, 63, 64, 65, 2047, 2048, M._NBINS - 1} | {int(e) for e in filled if e >= 1}
                       | {int(e) + 1 for e in filled if e + 1 < M._NBINS})
        for i in range(0, len(edges), M.MAX_CUTS):
            cuts = edges[i : i + M.MAX_CUTS]
            rc, stats_c, below = _cuts_call(x, kx, y, ky, cuts)
            assert rc == 0
            np.testing.assert_array_equal(stats_c, stats)  # every other statistic as with the histogram
            assert below.tolist() == [int(hist[:e].sum()) for e in cuts], cuts


@pytest.mark.skipif(not NATIVE, reason="no C compiler here")
def test_a_cut_one_bin_off_counts_differently():
    # the fault that proves the check above: the counts below an edge one bin away are not these
    a, b = adversarial(0)
    _, hist = _hist_call(a, 0, b, 0)
    e = int(np.flatnonzero(hist)[len(np.flatnonzero(hist)) // 2])
    _, _, below = _cuts_call(a, 0, b, 0, [e + 1])
    assert below[0] == hist[: e + 1].sum() != hist[:e].sum()


@pytest.mark.skipif(not NATIVE, reason="no C compiler here")
@pytest.mark.parametrize("cuts", [[0], [M._NBINS], [1] * 9, [-3]])
def test_cuts_outside_the_bins_are_refused(cuts):
    a = np.ones(100, dtype=np.float32)
    assert _cuts_call(a, 0, a, 0, cuts)[0] == -5
    assert _cuts_call(a, 0, a, 0, [1])[0] == 0
