"""hip/moe_route.hip itself, run on the CPU: the kernel source compiled by the host compiler
against tests/hip/simt/portable.h (a fiber per GPU thread, one barrier per wave, a shuffle that
not every lane of a wave reaches an error instead of a pass; tests/hip/test_simt_portable.py proves
the stand-in itself), on warp32 and wave64,
held to the torch reference op. It proves the router's logic and its wave-uniformity on a machine
without a GPU; tests/hip/test_hip_kernels.py holds the GPU build to the same op on the GPU.

The host maths library rounds expf/log1pf like the GPU's to an ulp or so: the ids must match
exactly (random keys are far apart), the weights to fp32 tolerance; exact ties are built from
saturated logits (> 20: softplus is the identity, sqrt is exact), where every library agrees.
"""
from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.backend.torch_ops import TorchBackend
from tests.hip.removed_routes import removed_router_routes

HIP = Path(__file__).resolve().parents[2] / "hip"
SIMT = Path(__file__).resolve().parent / "simt" / "portable.h"
CXX = shutil.which("g++") or shutil.which("clang++")
TD_F32, TD_BF16 = 0, 1
REF = TorchBackend()

pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++20 host compiler (g++ or clang++)")


HARNESS = """#include <atomic>
// the filter routes' probe: how many candidates each row had (a histogram, 1,024 = more)
static std::atomic<long> simt_candidates[1025];
static void simt_probe(int n) { simt_candidates[n < 1024 ? n : 1024]++; }
#define TD_ROUTER_FILTER_PROBE simt_probe
// the dispatcher's probe: the route code the last call ran (threads_per_row 0 resolved)
static std::atomic<int> simt_route{1};
static void simt_route_probe(int code) { simt_route = code; }
#define TD_ROUTER_ROUTE_PROBE simt_route_probe
// the fault planted now (the main build defines TD_ROUTER_PLANTED(n) to ask it; 0: none)
static std::atomic<int> simt_planted{0};
extern "C" void simt_plant(int n) { simt_planted = n; }
// the default's row thresholds as the tests set them (f32, bf16; 0: the shipped one)
static std::atomic<long> simt_from_rows[2] = {0, 0};
static void simt_from_rows_probe(int dtype, int64_t& from) { if (simt_from_rows[dtype] != 0) from = simt_from_rows[dtype]; }
#define TD_ROUTER_FROM_ROWS_PROBE simt_from_rows_probe
extern "C" void simt_set_from_rows(long f32, long bf16) { simt_from_rows[0] = f32; simt_from_rows[1] = bf16; }
#include "moe_route.hip"
extern "C" void simt_set_warp_size(int ws) { simt::warp_size = ws; }
extern "C" int simt_last_route() { return simt_route.exchange(1); }
extern "C" void simt_take_candidates(long* out) {
  for (int i = 0; i < 1025; ++i) out[i] = simt_candidates[i].exchange(0);
}
"""


def build(d: Path, *defines: str, opt: str = "-O1"):
    """moe_route.hip on the CPU stand-in, built in `d` with `defines` (-D...), as a ctypes library.
    A planted build that runs a few small launches takes `opt="-O0"`: half the compile (1.5 against
    3.2 s), which is most of its cost."""
    for name in ("moe_route.hip", "common.h", "kernels.h"):
        shutil.copy(HIP / name, d / name)
    shutil.copy(SIMT, d / "portable.h")  # found first: common.h includes "portable.h" from its own folder
    (d / "harness.cpp").write_text(HARNESS)
    r = subprocess.run([CXX, "-std=c++20", opt, "-pthread", "-shared", "-fPIC", "-Wall", "-Werror",
                        "-Wno-unknown-pragmas", *defines, f"-I{d}", str(d / "harness.cpp"),
                        "-o", str(d / "libroute.so")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    so = ctypes.CDLL(str(d / "libroute.so"))
    so.td_moe_route.restype = ctypes.c_int
    so.td_moe_route.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                                                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    so.simt_take_candidates.argtypes = [ctypes.c_void_p]
    so.simt_plant.argtypes = [ctypes.c_int]
    so.simt_set_from_rows.argtypes = [ctypes.c_long, ctypes.c_long]
    so.td_moe_route_table_check.restype = ctypes.c_int
    so.td_moe_route_table_check.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    so.td_moe_route_score_bound.restype = ctypes.c_int
    so.td_moe_route_score_bound.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_float, ctypes.c_void_p,
                                            ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    return so


# The main build also takes the faults planted at run time (hip/moe_route.hip
# TD_ROUTER_PLANTED, kPlant*; plant() below; none planted outside the tests that plant one)
PLANT_AT_RUN_TIME = "-DTD_ROUTER_PLANTED(n)=(simt_planted.load() == (n))"


@pytest.fixture(scope="module")
def lib(module_tmp):
    return build(module_tmp("simt"), PLANT_AT_RUN_TIME)


@pytest.fixture(scope="module")
def lib_no_margin(module_tmp):
    """Planted: the filter's bound made too tight (margin 0)."""
    return build(module_tmp("simt-no-margin"), "-DTD_ROUTER_FILTER_FAULT_NO_MARGIN", opt="-O0")


@pytest.fixture(scope="module")
def lib_slow(module_tmp):
    """The filter routes with every row on the slow path (a list of 0 candidates)."""
    return build(module_tmp("simt-slow"), "-DTD_ROUTER_FILTER_CAP=0")


@pytest.fixture
def lib_few_rows_g16(lib):
    """The default's row thresholds lowered at run time (filter_g16 from 8 f32 rows, exact_bf16 from
    4 bf16 rows), so both sides of each run on a few rows; the shipped ones again after."""
    lib.simt_set_from_rows(8, 4)
    yield lib
    lib.simt_set_from_rows(0, 0)


def candidates(lib) -> np.ndarray:
    """The probe's histogram since the last call: how many rows had n candidates (n = 1,024: more)."""
    out = np.zeros(1025, np.int64)
    lib.simt_take_candidates(out.ctypes.data)
    return out


def route(lib, logits, bias, bias_vl, image, k, scale, *, ws=32, fault=False, threads=0):
    """td_moe_route on the CPU stand-in, with a wave of `ws` lanes; (weights, ids) as torch."""
    rows, experts = logits.shape
    dtype = TD_BF16 if logits.dtype == torch.bfloat16 else TD_F32
    raw = np.ascontiguousarray((logits.view(torch.int16) if dtype == TD_BF16 else logits).numpy())
    b = np.ascontiguousarray(bias.numpy(), dtype=np.float32)
    bvl = None if bias_vl is None else np.ascontiguousarray(bias_vl.numpy(), dtype=np.float32)
    img = None if image is None else np.ascontiguousarray(image.numpy().astype(np.uint8))
    w = np.full((rows, k), np.nan, np.float32)  # unwritten slots stay NaN, never a plausible weight
    ids = np.full((rows, k), -1, np.int64)
    ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
    lib.simt_set_warp_size(ws)
    status = []
    t = threading.Thread(target=lambda: status.append(lib.td_moe_route(
        ptr(raw), ptr(b), ptr(bvl), ptr(img), ptr(w), ptr(ids), rows, experts, k, scale, dtype, int(fault), threads,
        None)), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the kernel deadlocked: a shuffle or barrier not reached by every lane"
    assert status == [0], status
    return torch.from_numpy(w), torch.from_numpy(ids)


def inputs(rows, experts, dtype, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, experts, generator=g) * scale).to(dtype)
    bias, bias_vl = torch.randn(experts, generator=g) * 0.3, torch.randn(experts, generator=g) * 0.3
    image = torch.rand(rows, generator=g) < 0.5
    return logits, bias, bias_vl, image


def same(got, want):
    w, ids = got
    w_ref, ids_ref = want
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref)


# rows x experts x k: one row, partial blocks, experts not a multiple of a wave or of a 16-byte
# vector, fewer experts than lanes, 384 (DeepSeek's), past 512, 1,024 (the most)
CASES = [(1, 8, 1), (5, 64, 2), (9, 100, 6), (19, 384, 6), (11, 384, 8), (6, 1000, 8), (3, 65, 7), (4, 1024, 8)]


# the named routes' codes (threads_per_row < 0, hip/moe_route.hip kRoute*; 0 is the default among them)
ROUTES = {"default": 0, "wave": -1, "wave_lb": -2, "filter": -6, "filter_redux": -7, "filter_g16": -11,
          "exact_bf16": -13}



def in_route_dtype(route_name: str, logits: torch.Tensor) -> torch.Tensor:
    """exact_bf16 ranks bf16 logits (on fp32 it runs filter_g16): an fp32 case, in bf16 for it."""
    return logits.to(torch.bfloat16) if route_name == "exact_bf16" else logits


# Against the reference: the wave routes and the default (a filter route); every filter route is
# held bit for bit to the wave route on the same cases (test_a_filter_route_is_the_wave_route_bit_for_bit),
# which is this test's reference match for them at a fifth of the SIMT runs.
@pytest.mark.parametrize("route_name", ["default", "wave", "wave_lb"])
@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rows,experts,k", CASES, ids=str)
def test_every_route_matches_the_reference(lib, ws, dtype, rows, experts, k, route_name):
    logits, bias, bias_vl, image = inputs(rows, experts, dtype, seed=rows * 1000 + experts)
    same(route(lib, logits, bias, bias_vl, image, k, 1.5, ws=ws, threads=ROUTES[route_name]),
         REF.moe_route(logits, bias, bias_vl, image, k, 1.5))


@pytest.mark.parametrize("route_name", list(ROUTES))
@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("mode", ["text-only", "no-bias-vl"])
def test_every_route_without_image_rows(lib, ws, mode, route_name):
    logits, bias, bias_vl, image = inputs(21, 384, torch.float32, seed=7)
    logits = in_route_dtype(route_name, logits)
    args = (logits, bias, None if mode == "no-bias-vl" else bias_vl, None if mode == "text-only" else image, 6, 2.5)
    same(route(lib, *args, ws=ws, threads=ROUTES[route_name]), REF.moe_route(*args))


@pytest.mark.parametrize("code", [-99, 32, *(c for _, c in removed_router_routes())])
def test_an_unknown_or_removed_route_code_is_refused(lib, code):
    logits, bias, bias_vl, image = inputs(3, 64, torch.float32)
    with pytest.raises(AssertionError, match=r"\[-2\]"):  # TD_BAD_SHAPE, nothing launched
        route(lib, logits, bias, bias_vl, image, 2, 1.0, threads=code)


def ranked_by_key_then_id(keys: np.ndarray, s: np.ndarray, k: int, scale: float):
    """Top-k by descending key, ties to the lower id; weights from s (the kernel's contract)."""
    ids = np.stack([np.lexsort((np.arange(keys.shape[1]), -row))[:k] for row in keys])
    w = np.take_along_axis(s, ids, 1)
    w = w / (w.sum(1, keepdims=True, dtype=np.float32) + np.float32(1e-20)) * np.float32(scale)
    return torch.from_numpy(w.astype(np.float32)), torch.from_numpy(ids)


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", list(ROUTES))
def test_exact_ties_go_to_the_lower_expert_id(lib, route_name, ws):
    """Saturated logits of a few integer values and a zero bias: dozens of experts per row share
    each key; the kernel must pick the lowest ids among equal keys, in id order."""
    g = torch.Generator().manual_seed(3)
    logits = in_route_dtype(route_name, torch.randint(21, 25, (13, 384), generator=g).float())  # bf16: exact
    bias = torch.zeros(384)
    got = route(lib, logits, bias, None, None, 8, 1.0, ws=ws, threads=ROUTES[route_name])
    s = np.sqrt(logits.float().numpy())
    same(got, ranked_by_key_then_id(s, s, 8, 1.0))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("route_name", list(ROUTES))
def test_winners_crowded_in_few_lanes_on_every_other_row(lib, route_name, ws, dtype):
    """The bias lifts experts 0, 16, 32, ... on even rows only; odd rows are plain random. On a wave
    (expert e in lane e % ws) two lanes of a warp32, four of a wave64, hold every winner: the same
    lanes win round after round and rescan their slots, and rows of one block take different
    winners' paths; every shuffle must still see the whole wave."""
    logits, bias, _, _ = inputs(17, 384, dtype, seed=11)  # a random text bias: bf16 logits tie without one
    bias_vl = torch.zeros(384)
    bias_vl[::16] = 50.0 + torch.arange(24, dtype=torch.float32)  # image rows: the winners are 0, 16, 32, ...
    image = torch.arange(17) % 2 == 0
    t = ROUTES[route_name]
    same(route(lib, logits, bias, bias_vl, image, 8, 1.5, ws=ws, threads=t),
         REF.moe_route(logits, bias, bias_vl, image, 8, 1.5))
    _, ids = route(lib, logits, bias, bias_vl, image, 8, 1.5, ws=ws, threads=t)
    assert (ids[image] % 16 == 0).all()  # the case is the one it says


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", list(ROUTES))
def test_the_planted_fault_ranks_image_rows_with_the_text_bias(lib, route_name, ws):
    logits, bias, _, _ = inputs(24, 384, torch.float32, seed=5)
    logits = in_route_dtype(route_name, logits)
    bias_vl = -bias + torch.randn(384, generator=torch.Generator().manual_seed(6))
    image = torch.arange(24) % 3 == 0
    _, ids = route(lib, logits, bias, bias_vl, image, 6, 1.5, ws=ws, fault=True, threads=ROUTES[route_name])
    _, ids_ok = REF.moe_route(logits, bias, bias_vl, image, 6, 1.5)
    _, ids_text = REF.moe_route(logits, bias, None, None, 6, 1.5)
    assert torch.equal(ids, ids_text)
    assert torch.equal(ids[~image], ids_ok[~image]) and not torch.equal(ids[image], ids_ok[image])


@pytest.mark.parametrize("threads", [64, 128])
def test_the_block_route_under_the_same_stand_in(lib, threads):
    """The older one-row-per-block route (barriers, shared memory) through the same harness: the
    stand-in runs both routes, so a disagreement is the kernel's, not the harness's."""
    logits, bias, bias_vl, image = inputs(7, 384, torch.float32, seed=9)
    same(route(lib, logits, bias, bias_vl, image, 6, 1.5, ws=64, threads=threads),
         REF.moe_route(logits, bias, bias_vl, image, 6, 1.5))


# --- the filter routes (hip/moe_route.hip: a fast bound on every expert, exact scores for the
# candidates only): the same ids AND weights, bit for bit, as the wave route that ranks every
# expert exactly; the stand-in's fast functions are worse than the GPUs' (simt/portable.h) ----

# exact_bf16 is filter_g16's steps on exact keys (a table of bf16 scores): held to the same tests
FILTERS = [name for name in ROUTES if name.startswith("filter")] + ["exact_bf16"]
FAST_BOUND_FILTERS = [name for name in FILTERS if name != "exact_bf16"]  # a margin to plant too tight


def near_ties(rows: int, experts: int, group: int, seed: int):
    """Saturated logits (> 20: s = sqrt(l), correctly rounded everywhere) where `group` experts a
    row sit a few ulps apart, many of them equal after the root, the rest far below: the k-th
    and (k+1)-th keys are closer than the fast functions' error. Zero bias."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((rows, experts), 21.0) - torch.rand(rows, experts, generator=g)  # s in (4.47, 4.58]
    for r in range(rows):
        cols = torch.randperm(experts, generator=g)[:group]
        logits[r, cols] = 30.0 + torch.randint(0, 3 * group, (group,), generator=g).float() * 2.0 ** -19
    return logits, torch.zeros(experts)


def sqrt_ranked(logits: torch.Tensor, k: int, scale: float):
    s = np.sqrt(logits.numpy().astype(np.float32))  # correctly rounded, as sqrtf
    return ranked_by_key_then_id(s, s, k, scale)


def bitwise(got, want):
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("route_name", FILTERS)
@pytest.mark.parametrize("rows,experts,k", CASES + [(70, 384, 6)], ids=str)  # 70: many waves of 16-lane groups
def test_a_filter_route_is_the_wave_route_bit_for_bit(lib, route_name, dtype, ws, rows, experts, k):
    logits, bias, bias_vl, image = inputs(rows, experts, dtype, seed=rows * 1000 + experts + 1)
    args = (logits, bias, bias_vl, image, k, 1.5)
    bitwise(route(lib, *args, ws=ws, threads=ROUTES[route_name]), route(lib, *args, ws=ws, threads=ROUTES["wave"]))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
@pytest.mark.parametrize("k", range(1, 9))
def test_a_filter_route_takes_every_topk(lib, route_name, ws, k):
    logits, bias, bias_vl, image = inputs(9, 384, torch.float32, seed=40 + k)
    logits = in_route_dtype(route_name, logits)
    same(route(lib, logits, bias, bias_vl, image, k, 1.5, ws=ws, threads=ROUTES[route_name]),
         REF.moe_route(logits, bias, bias_vl, image, k, 1.5))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
def test_a_filter_route_near_ties(lib, route_name, ws):
    """40 near-equal keys a row: more candidates than a warp32 has lanes (a lane ranks two), all
    on the list (fewer than kFilterCap): the exact ranks still decide, ties to the lower id."""
    logits, bias = near_ties(12, 384, 40, seed=21)
    logits = in_route_dtype(route_name, logits)  # bf16: the 40 near ties are 40 exact ties at 30
    candidates(lib)
    got = route(lib, logits, bias, None, None, 8, 1.5, ws=ws, threads=ROUTES[route_name])
    seen = candidates(lib)
    same(got, sqrt_ranked(logits.float(), 8, 1.5))
    n = np.repeat(np.arange(1025), seen)
    assert len(n) == 12 and (n >= 40).all() and (n <= 64).all(), n  # the case is the one it says


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FAST_BOUND_FILTERS)
def test_a_filter_route_without_a_margin_misses_near_ties(lib_no_margin, route_name, ws):
    """Planted: the bound made too tight. The near ties' fast scores disorder the top keys, so an
    expert of the exact top-k falls below the threshold: some row's ids are wrong."""
    logits, bias = near_ties(12, 384, 40, seed=21)
    _, ids = route(lib_no_margin, logits, bias, None, None, 8, 1.5, ws=ws, threads=ROUTES[route_name])
    assert not torch.equal(ids, sqrt_ranked(logits, 8, 1.5)[1])


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
def test_a_filter_route_on_random_rows_ranks_few_candidates(lib, route_name, ws):
    """The reason the route is fast: random rows of 384 have about k + a few candidates. With the
    stand-in's worse fast functions, still: none above 2k, the mean under k + 3."""
    logits, bias, bias_vl, image = inputs(64, 384, torch.float32, seed=17)
    logits = in_route_dtype(route_name, logits)
    candidates(lib)
    route(lib, logits, bias, bias_vl, image, 6, 1.5, ws=ws, threads=ROUTES[route_name])
    n = np.repeat(np.arange(1025), candidates(lib))
    assert len(n) == 64 and n.min() >= 6 and n.max() <= 12 and n.mean() < 9, (n.mean(), n.max())


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
def test_a_filter_route_takes_the_slow_path_for_mass_ties(lib, route_name, ws):
    """Saturated logits of four values: ~96 experts a row share a key, more than kFilterCap
    candidates: the rows take k rounds of wave maxima, with the same result."""
    g = torch.Generator().manual_seed(3)
    logits = in_route_dtype(route_name, torch.randint(21, 25, (13, 384), generator=g).float())
    candidates(lib)
    got = route(lib, logits, torch.zeros(384), None, None, 8, 1.0, ws=ws, threads=ROUTES[route_name])
    assert (np.repeat(np.arange(1025), candidates(lib)) > 64).all()
    s = np.sqrt(logits.float().numpy())
    same(got, ranked_by_key_then_id(s, s, 8, 1.0))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
def test_the_slow_path_alone_is_the_wave_route(lib, lib_slow, route_name, ws):
    """Built with a list of no candidates, every row takes the slow path: random rows (f32, bf16,
    image rows), near ties and 1,000 experts all equal the wave route bit for bit."""
    cases = [inputs(9, 384, torch.float32, seed=1), inputs(6, 1000, torch.bfloat16, seed=2)]
    cases += [(*near_ties(5, 384, 40, seed=4), None, None)]
    for logits, bias, bias_vl, image in cases:
        args = (in_route_dtype(route_name, logits), bias, bias_vl, image, 8, 1.5)
        bitwise(route(lib_slow, *args, ws=ws, threads=ROUTES[route_name]),
                route(lib, *args, ws=ws, threads=ROUTES["wave"]))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("route_name", FILTERS)
def test_a_filter_route_with_infinite_and_saturated_logits(lib, route_name, dtype, ws):
    """-inf logits (s = 0), logits past 20 (s = sqrt(l), the other branch), +inf (no bound: always a
    candidate, key +inf), a bias that lifts an s = 0 expert into the top: as the reference."""
    logits, bias, bias_vl, image = inputs(16, 384, torch.float32, seed=8)
    g = torch.Generator().manual_seed(9)
    logits[torch.rand(16, 384, generator=g) < 0.3] = -float("inf")
    logits[torch.rand(16, 384, generator=g) < 0.1] = 25.0 + 50 * torch.rand(1, generator=g).item()
    logits[3, 7] = float("inf")
    logits[5, :] = -float("inf")  # every s = 0: the biases alone rank
    bias[11] = 9.0  # lifts expert 11 on text rows even where its s is 0
    logits = logits.to(dtype)
    args = (logits, bias, bias_vl, image, 6, 1.5)
    got = route(lib, *args, ws=ws, threads=ROUTES[route_name])
    bitwise(got, route(lib, *args, ws=ws, threads=ROUTES["wave"]))
    want = REF.moe_route(*args)
    assert torch.equal(got[1], want[1])
    ok = torch.isfinite(want[0])  # the +inf row's weights are inf / inf
    torch.testing.assert_close(got[0][ok], want[0][ok])


def score_bound_violations(lib, start: int, count: int, margin_scale: float) -> int:
    bad, example = np.zeros(256, np.uint32), np.zeros(256, np.uint32)
    lib.simt_set_warp_size(32)
    assert lib.td_moe_route_score_bound(start, count, margin_scale, bad.ctypes.data, example.ctypes.data, 256,
                                        None) == 0
    return int(bad.sum())


# 4,096 consecutive fp32 bit patterns around each point where a bound's error changes: 0, tiny,
# the log's [0.5, 2] range, a few more in -16..3, the l > 20 switch, -87
# where exp flushes, huge
BOUND_POINTS = (1e-30, 0.5, 1.0, 2.0, 3.015625, 7.5, 19.999, 20.0, 20.001, 88.0, 1e30, -1e-30, -0.5, -2.0, -15.0,
                -15.984375, -16.0, -16.1, -87.0, -87.5, -103.0, -1e30)
BOUND_STARTS = [int(np.array(x, np.float32).view(np.uint32)) - 2048 for x in BOUND_POINTS]


def test_the_score_bound_holds_and_a_tighter_one_does_not(lib):
    """td_moe_route_score_bound (the GPU test runs every fp32 bit pattern) on the stand-in: none
    outside the routes' margin; a margin of 1/16 of it has violations, so the check can fail."""
    assert sum(score_bound_violations(lib, s, 4096, 1.0) for s in BOUND_STARTS) == 0
    assert sum(score_bound_violations(lib, s, 4096, 1 / 16) for s in BOUND_STARTS) > 0


# --- exact_bf16's table of exact scores over the bf16 window [2^-25, 2^7) (hip/moe_route.hip) ------

@pytest.fixture(scope="module")
def lib_table_ulp(module_tmp):
    """Planted: the table's entries for logits in [2, 4) (both signs) an ulp up."""
    return build(module_tmp("simt-table-ulp"), "-DTD_ROUTER_TABLE_FAULT_ULP", opt="-O0")


@pytest.fixture(scope="module")
def lib_table_edge(module_tmp):
    """Planted: the window one bf16 too wide at the top: 127.5 and -127.5 take the NaN entry as a score."""
    return build(module_tmp("simt-table-edge"), "-DTD_ROUTER_TABLE_FAULT_EDGE", opt="-O0")


# hip/moe_route.hip kPlant*: a word's high logit indexed with the low one's sign; the threshold's
# sort a step short; the row block just ranked loaded again instead of the next
PLANTED = {"pair_sign": 1, "sort_short": 2, "prefetch_same": 3}


@contextlib.contextmanager
def planted(lib, name: str):
    """Fault `name` planted in the main build for the block's launches, none again after."""
    lib.simt_plant(PLANTED[name])
    try:
        yield
    finally:
        lib.simt_plant(0)


def table_mismatches(lib) -> tuple[int, set[int]]:
    """td_moe_route_table_check: how many bf16 bit patterns' looked-up scores are not exact_score
    bit for bit, and the bits of each thread's last one."""
    bad, example = np.zeros(256, np.uint32), np.zeros(256, np.uint32)
    lib.simt_set_warp_size(32)
    assert lib.td_moe_route_table_check(bad.ctypes.data, example.ctypes.data, None) == 0
    return int(bad.sum()), {int(x) for x in example[bad > 0]}


def test_the_score_table_is_exact_for_every_bf16_value(lib, lib_table_ulp, lib_table_edge):
    """All 65,536 bf16 patterns: the table route's score is exact_score's, bit for bit, and its index
    in a word's high half (beside its sign-flipped self) the same as alone; the planted tables are
    caught where they are wrong, and only there."""
    assert table_mismatches(lib) == (0, set())
    n, where = table_mismatches(lib_table_ulp)
    assert n == 2 * 128 and all((h >> 7) & 0xFF == 128 for h in where), (n, sorted(map(hex, where)))
    n, where = table_mismatches(lib_table_edge)
    assert n == 2 and where and where <= {0x42FF, 0xC2FF}, (n, where)  # 127.5 and -127.5 (one thread's)
    with planted(lib, "pair_sign"):
        assert table_mismatches(lib)[0] == 65536  # each pattern's partner has the other sign


def bf16_from_bits(bits) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


# bf16 bit patterns at and around the table's window edges (2^-25 = 0x3300; 127.5 = 0x42FF, the
# first off it at the top; both signs), zeros, infinities, NaNs, and [2, 4)
EDGE_BITS = [0x32FF, 0x3300, 0x3301, 0x42FF, 0x4300, 0x4301, 0xB2FF, 0xB300, 0xB301, 0xC2FF, 0xC300, 0xC301,
             0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x7FC0, 0x4000, 0x4040, 0x407F, 0xC040, 0x3F80, 0x4F00]


def edge_rows(seed: int):
    """Six edge logits a row at experts 5..10, lifted by the bias above every other expert (small
    random logits), so each edge value's score is a weight: the table's every edge is seen."""
    g = torch.Generator().manual_seed(seed)
    n = len(EDGE_BITS) // 6
    logits = (torch.randn(n, 384, generator=g) * 2).to(torch.bfloat16)
    logits[:, 5:11] = bf16_from_bits(EDGE_BITS).view(n, 6)
    bias = 0.3 * torch.randn(384, generator=g)
    bias[5:11] = 30.0
    return logits, bias


@pytest.mark.parametrize("ws", [32, 64])
def test_exact_bf16_at_the_table_window_edges(lib, ws):
    """Logits at the window's edges (in, out, either side), +-0, +-inf, NaN: exact_bf16 is the wave
    route bit for bit, with a finite bias and with an infinite and a NaN one."""
    logits, bias = edge_rows(seed=50)
    for b in (bias, torch.cat([bias[:12], torch.tensor([float("inf"), float("nan")]), bias[14:]])):
        args = (logits, b, None, None, 6, 1.5)
        bitwise(route(lib, *args, ws=ws, threads=ROUTES["exact_bf16"]), route(lib, *args, ws=ws, threads=ROUTES["wave"]))


@pytest.mark.parametrize("planted", ["lib_table_ulp", "lib_table_edge"])
def test_exact_bf16_with_a_wrong_table_entry_fails(lib, planted, request):
    """Planted: an entry an ulp off, the window's edge one too wide: the edge rows' weights (or ids)
    are no longer the wave route's."""
    bad = request.getfixturevalue(planted)
    args = (*edge_rows(seed=50), None, None, 6, 1.5)
    w, ids = route(bad, *args, threads=ROUTES["exact_bf16"])
    w_ok, ids_ok = route(lib, *args, threads=ROUTES["wave"])
    assert not (torch.equal(ids, ids_ok) and torch.equal(w.view(torch.int32), w_ok.view(torch.int32)))


@pytest.mark.parametrize("fault", list(PLANTED))
def test_exact_bf16_with_a_planted_step_fault_fails(lib, fault):
    """Planted, each a step of exact_bf16 made wrong while the candidates' exact scores stay right: a
    word's high logit keyed with the low one's sign; the threshold's sort a step short (T above
    the k-th largest key); the next row block's quads not loaded (70 rows: the stand-in's 3
    persistent blocks take 2 row blocks each). Random rows' ids are no longer the wave route's
    (with none planted, the same rows are bit for bit: the 70-row case of
    test_a_filter_route_is_the_wave_route_bit_for_bit)."""
    args = (*inputs(70, 384, torch.bfloat16, seed=65), 6, 1.5)
    with planted(lib, fault):
        got = route(lib, *args, threads=ROUTES["exact_bf16"])
    want = route(lib, *args, threads=ROUTES["wave"])
    assert not torch.equal(got[1], want[1])
    bitwise(route(lib, *args, threads=ROUTES["exact_bf16"]), want)  # and unplanted again, the same build


@pytest.mark.parametrize("ws", [32, 64])
def test_exact_bf16_off_its_table_is_filter_g16(lib, ws):
    """What the table route does not take (fp32 logits, experts not whole quads or over 512, a row
    not 8-byte aligned) runs filter_g16: bit for bit the wave route still."""
    for logits, bias, bias_vl, image in [inputs(9, 384, torch.float32, seed=61), inputs(7, 66, torch.bfloat16, seed=62),
                                         inputs(5, 516, torch.bfloat16, seed=63)]:
        args = (logits, bias, bias_vl, image, 6, 1.5)
        bitwise(route(lib, *args, ws=ws, threads=ROUTES["exact_bf16"]), route(lib, *args, ws=ws, threads=ROUTES["wave"]))
    # a row 2 bytes off 8-byte alignment: the logits one bf16 into a larger buffer
    logits, bias, bias_vl, image = inputs(6, 384, torch.bfloat16, seed=64)
    buf = torch.zeros(6 * 384 + 4, dtype=torch.bfloat16)
    buf[1:1 + 6 * 384] = logits.reshape(-1)
    shifted = buf[1:1 + 6 * 384].view(6, 384)
    assert shifted.data_ptr() % 8 != 0
    bitwise(route(lib, shifted, bias, bias_vl, image, 6, 1.5, ws=ws, threads=ROUTES["exact_bf16"]),
            route(lib, logits, bias, bias_vl, image, 6, 1.5, ws=ws, threads=ROUTES["wave"]))


def clustered_keys(rows: int, experts: int, group: int, seed: int):
    """Logits in [1, 5] and a bias that brings `group` experts' keys within 0.002 of each other,
    the rest far below: the keys' order inside the cluster is finer than the fast bound's width,
    so only the bound's full margin keeps the exact top-k among the candidates."""
    g = torch.Generator().manual_seed(seed)
    logits = 1 + 4 * torch.rand(rows, experts, generator=g)
    s = torch.nn.functional.softplus(logits).sqrt()
    bias = -1.0 - s[0] + 0.0  # the far rest: keys near -1
    cols = torch.randperm(experts, generator=g)[:group]
    bias[cols] = 3.0 - s[0, cols] + 0.002 * torch.rand(group, generator=g)
    logits[1:] = logits[0] + 1e-3 * torch.randn(rows - 1, experts, generator=g)  # rows alike: keys still clustered
    return logits, bias


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
def test_a_filter_route_clustered_keys(lib, route_name, ws):
    """40 keys within 0.002 (coarser than the fast functions' error): as the wave route, bit for bit."""
    logits, bias = clustered_keys(16, 384, 40, seed=31)
    args = (in_route_dtype(route_name, logits), bias, None, None, 8, 1.5)
    bitwise(route(lib, *args, ws=ws, threads=ROUTES[route_name]), route(lib, *args, ws=ws, threads=ROUTES["wave"]))


@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("route_name", FILTERS)
def test_a_filter_route_mixes_slow_and_fast_rows(lib, route_name, ws):
    """Mass-tie rows (the slow path) between random rows: a wave holding both (filter_g16 puts 2
    or 4 rows in one) sends them all down the slow path together; every row still the wave
    route's, bit for bit."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(23, 384, generator=g) * 2
    logits[::3] = torch.randint(21, 25, (8, 384), generator=g).float()
    args = (in_route_dtype(route_name, logits), torch.zeros(384), None, None, 8, 1.5)
    candidates(lib)
    bitwise(route(lib, *args, ws=ws, threads=ROUTES[route_name]), route(lib, *args, ws=ws, threads=ROUTES["wave"]))
    n = np.repeat(np.arange(1025), candidates(lib))
    assert (n > 64).sum() == 8 and (n <= 16).sum() == 15  # the case is the one it says


def last_route(lib) -> int:
    """The route code the last td_moe_route call dispatched to (1: no call since the last ask)."""
    return lib.simt_last_route()


# the default by row count and dtype (hip/moe_route.hip default_route): filter_redux below the
# dtype's threshold, from it on filter_g16 (f32) / exact_bf16 (bf16); each side the same numbers as
# the routes and `wave`
@pytest.mark.parametrize("ws", [32, 64])
@pytest.mark.parametrize("dtype,rows,want", [
    (torch.float32, 7, "filter_redux"), (torch.float32, 8, "filter_g16"), (torch.float32, 13, "filter_g16"),
    (torch.bfloat16, 3, "filter_redux"), (torch.bfloat16, 4, "exact_bf16"), (torch.bfloat16, 7, "exact_bf16"),
], ids=str)
def test_the_default_chooses_its_route_by_rows_and_dtype(lib_few_rows_g16, ws, dtype, rows, want):
    args = (*inputs(rows, 384, dtype, seed=rows + 40), 6, 1.5)
    got = route(lib_few_rows_g16, *args, ws=ws, threads=ROUTES["default"])
    assert last_route(lib_few_rows_g16) == ROUTES[want]
    for name in ("filter_redux", "filter_g16", "exact_bf16", "wave"):
        bitwise(got, route(lib_few_rows_g16, *args, ws=ws, threads=ROUTES[name]))
        assert last_route(lib_few_rows_g16) == ROUTES[name]  # a named route runs itself, whatever the rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_default_on_few_rows_is_filter_redux(lib, dtype):
    """The shipped thresholds (tens of thousands of rows) leave a small call on filter_redux."""
    route(lib, *inputs(19, 384, dtype), 6, 1.5, threads=ROUTES["default"])
    assert last_route(lib) == ROUTES["filter_redux"]
