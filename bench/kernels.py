"""Each HIP kernel against torch eager and against the copy roofline, at the real model's sizes.

    python bench/kernels.py [--out bench-kernels.json] [--reps 20]

The roofline of a memory-bound kernel is the fewest bytes it must move (every input read once,
every output written once) over the device-to-device copy bandwidth measured in the same run
(bytes read + bytes written). Times are device times: each side's calls are captured in a CUDA
graph and replayed, so launch gaps and Python dispatch stay out (they are reported separately
as `*_loop_us`, a plain loop of calls). Inputs rotate over enough sets to be several times the
L2, so the numbers are not cache hits. Sizes: 9,000 patch rows x 1024 (RMSNorm, RoPE over 16
heads of 64), the 588->592 patch projection, a 90x99 patch grid at the 1,024-token budget for
the aligner (990 tokens x 9216), 1,024 rows x 384 experts top-6 for the router, a 1,022-row image
span scattered into 2,048 x 5120 embeddings.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backend import pad_columns  # noqa: E402
from engine.backend.hip_ops import ROUTER_ROUTES, HipBackend  # noqa: E402
from engine.backend.torch_ops import TorchBackend  # noqa: E402

L2_ROTATE_BYTES = 256 << 20  # rotate inputs over at least this much memory (H200 L2: 60 MB)
WARM_MS = 150.0  # replay each graph this long before timing: the SM clock ramps up under load


_variants: dict = {}


def variant(**options) -> HipBackend:
    """A HipBackend built with non-default options (same compiled module)."""
    key = tuple(sorted(options.items()))
    if key not in _variants:
        _variants[key] = HipBackend(**options)
    return _variants[key]


def router_agreement(call, hip, ref, wave, a) -> dict:
    """What a router case's timed kernel computes on its first input set: the rows whose ids differ
    from torch's (torch's order among exactly tied keys is unspecified, so a tied row may), the
    largest weight difference, and whether ids and weights equal `wave`'s (the wave route: every
    expert ranked exactly, ties to the lower id) bit for bit. A route is only worth its time if
    it computes the same thing."""
    w, ids = call(hip, a)
    w_ref, ids_ref = call(ref, a)
    w_wave, ids_wave = wave.moe_route(a[0], a[1], a[2], a[3], 6, 1.5)
    return {"rows_differing_from_torch": int((ids != ids_ref).any(-1).sum()),
            "max_weight_diff_vs_torch": float((w - w_ref).abs().max()),
            "bitwise_equal_wave_route": bool(torch.equal(ids, ids_wave)
                                             and torch.equal(w.view(torch.int32), w_wave.view(torch.int32)))}


def sm_clock_mhz() -> int | None:
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # no NVML / amdsmi: the clock is simply not reported
        return None


def events_ms(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def copy_bandwidth(reps: int) -> float:
    """Device-to-device copy, bytes read + written per second (GB/s)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = statistics.median(events_ms(lambda: dst.copy_(src), reps))
    del src, dst
    return 2 * n / (ms * 1e-3) / 1e9


def graph_us(call, n_sets: int, reps: int) -> float:
    """Median device time per call: n_sets calls (one per input set) captured once, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(n_sets):  # warm up: build, handles, allocator
            call(i)
    torch.cuda.current_stream().wait_stream(s)
    calls = max(n_sets, 32)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(calls):
            call(j % n_sets)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    while True:  # until the clocks have settled
        g.replay()
        b.record()
        b.synchronize()
        if a.elapsed_time(b) > WARM_MS:
            break
    ms = statistics.median(events_ms(g.replay, reps))
    return ms * 1e3 / calls


def launch_floor_us(reps: int) -> float:
    """Device time of the smallest kernel (a 1-element add), graph-replayed: no kernel that
    depends on its own input can finish sooner, whatever bytes it moves."""
    x = torch.zeros(1, device="cuda")
    return graph_us(lambda i: x.add_(1.0), 1, reps)


def loop_us(call, n_sets: int, reps: int) -> float:
    calls = max(n_sets, 32)

    def run():
        for j in range(calls):
            call(j % n_sets)

    run()
    return statistics.median(events_ms(run, reps)) * 1e3 / calls


def sets_for(bytes_per_set: int) -> int:
    return max(2, min(64, math.ceil(L2_ROTATE_BYTES / max(bytes_per_set, 1))))


def cases(g: torch.Generator):
    """(name, shape note, bytes moved per call, flops, make_inputs(), call(backend, inputs))."""
    def rn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    out = []
    for dt, tag in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        es = torch.finfo(dt).bits // 8
        out.append((f"rms_norm/{tag}", "9000x1024", 2 * 9000 * 1024 * es + 1024 * 4, 0,
                    lambda dt=dt: (rn(9000, 1024, dtype=dt), rn(1024, dtype=torch.float32)),
                    lambda be, a: be.rms_norm(a[0], a[1], 1e-6)))

    def rope_inputs(width, hd):
        ang = torch.rand(9000, width, generator=g, device="cuda") * 40
        return rn(9000, 16, hd), ang.cos(), ang.sin()

    out.append(("rope/deepseek-half-table", "9000x16x64 bf16, table [9000,32] f32",
                2 * 9000 * 1024 * 2 + 2 * 9000 * 32 * 4, 0, lambda: rope_inputs(32, 64),
                lambda be, a: be.rope_rotate_half(*a)))
    for nbytes in (8, 4):  # narrower accesses: more, smaller work items
        out.append((f"rope/deepseek-half-table@{nbytes}B", "9000x16x64 bf16, x read/written 8 or 4 bytes at a time",
                    2 * 9000 * 1024 * 2 + 2 * 9000 * 32 * 4, 0, lambda: rope_inputs(32, 64),
                    lambda be, a, n=nbytes: be.rope_rotate_half(*a) if be.name != "hip"
                    else variant(rope_access_bytes=n).rope_rotate_half(*a)))
    out.append(("rope/qwen-full-table", "9000x16x72 bf16, table [9000,72] f32",
                2 * 9000 * 16 * 72 * 2 + 2 * 9000 * 72 * 4, 0, lambda: rope_inputs(72, 72),
                lambda be, a: be.rope_rotate_half(*a)))
    out.append(("patch_linear/tiled", "9000x592 . 1024x592 bf16 (+bias)",
                (9000 * 592 + 1024 * 592 + 9000 * 1024) * 2, 2 * 9000 * 592 * 1024,
                lambda: (pad_columns(rn(9000, 588)), pad_columns(rn(1024, 588, scale=0.04)), rn(1024)),
                lambda be, a: be.patch_linear(*a)))

    def aligner_inputs():
        n_h, n_w = 90, 99
        gh, gw = -(-n_h // 3), -(-n_w // 3)
        ty = (torch.arange(gh).view(gh, 1, 1, 1) * 3 + torch.arange(3).view(1, 1, 3, 1)).expand(gh, gw, 3, 3)
        tx = (torch.arange(gw).view(1, gw, 1, 1) * 3 + torch.arange(3).view(1, 1, 1, 3)).expand(gh, gw, 3, 3)
        idx = torch.where((ty < n_h) & (tx < n_w), ty * n_w + tx, torch.full_like(ty, -1))
        return rn(n_h * n_w, 1024), idx.reshape(-1, 9).to(torch.int32).cuda()

    out.append(("aligner_gather", "90x99 grid x 1024 bf16 -> 990x9216",
                (90 * 99 * 1024 + 990 * 9216) * 2 + 990 * 9 * 4, 0, aligner_inputs,
                lambda be, a: be.aligner_gather(*a)))
    for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        es = torch.finfo(dt).bits // 8
        out.append((f"moe_route/{tag}", "1024x384 top-6, image rows interleaved",
                    1024 * 384 * es + 2 * 384 * 4 + 1024 + 1024 * 6 * (4 + 8), 0,
                    lambda dt=dt: (rn(1024, 384, dtype=dt, scale=2.0), rn(384, dtype=torch.float32),
                                   rn(384, dtype=torch.float32), torch.arange(1024, device="cuda") % 2 == 1),
                    lambda be, a: be.moe_route(a[0], a[1], a[2], a[3], 6, 1.5)))
    # At 1,024 rows every row is in flight at once: the time is one row's dependent chain (the
    # 0.4 us copy roofline is below a single kernel's latency, even graph-replayed). At 65,536
    # rows (100 MB of f32 logits, ~8 rounds of resident waves) the copy takes >> a launch and
    # the share of the roofline measures the kernel's throughput.
    for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        es = torch.finfo(dt).bits // 8
        rows = 65536
        out.append((f"moe_route/{tag}/65536rows", f"{rows}x384 top-6, image rows interleaved",
                    rows * 384 * es + 2 * 384 * 4 + rows + rows * 6 * (4 + 8), 0,
                    lambda dt=dt, rows=rows: (rn(rows, 384, dtype=dt, scale=2.0), rn(384, dtype=torch.float32),
                                              rn(384, dtype=torch.float32),
                                              torch.arange(rows, device="cuda") % 2 == 1),
                    lambda be, a: be.moe_route(a[0], a[1], a[2], a[3], 6, 1.5)))
    for tpr in (64, 128, 256):  # threads per row: the automatic choice for 384 experts is 64
        out.append((f"moe_route/f32@{tpr}t", "1024x384 top-6, image rows interleaved",
                    1024 * 384 * 4 + 2 * 384 * 4 + 1024 + 1024 * 6 * (4 + 8), 0,
                    lambda: (rn(1024, 384, dtype=torch.float32, scale=2.0), rn(384, dtype=torch.float32),
                             rn(384, dtype=torch.float32), torch.arange(1024, device="cuda") % 2 == 1),
                    lambda be, a, t=tpr: (be if be.name != "hip" else variant(router_threads=t)).moe_route(
                        a[0], a[1], a[2], a[3], 6, 1.5)))

    # every named route of the router (hip/moe_route.hip kRoute*, HipBackend router_threads) at both
    # sizes and both dtypes, in this one run: `router_best` names the fastest per size and dtype,
    # what kDefaultRoute should be
    for route in ROUTER_ROUTES:
        for rows in (1024, 65536):
            for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
                if route in BF16_ONLY_ROUTES and dt != torch.bfloat16:
                    continue  # on fp32 it runs another route (filter_g16), measured under its own name
                es = torch.finfo(dt).bits // 8
                out.append((f"moe_route/{tag}/{rows}rows@{route}", f"{rows}x384 top-6, image rows interleaved",
                            rows * 384 * es + 2 * 384 * 4 + rows + rows * 6 * (4 + 8), 0,
                            lambda dt=dt, rows=rows: (rn(rows, 384, dtype=dt, scale=2.0), rn(384, dtype=torch.float32),
                                                      rn(384, dtype=torch.float32),
                                                      torch.arange(rows, device="cuda") % 2 == 1),
                            lambda be, a, r=route: (be if be.name != "hip" else variant(router_threads=r)).moe_route(
                                a[0], a[1], a[2], a[3], 6, 1.5)))

    def scatter_inputs():
        rows = torch.arange(1022, device="cuda") + 500
        return rn(2048, 5120), rows, rn(1022, 5120)

    # The reference op masks rows < 0 with a boolean index (a host sync, which a graph cannot
    # hold); every row is valid here, so eager's equivalent is a plain index_copy_.
    out.append(("embed_scatter", "1022 rows x 5120 bf16 into 2048x5120",
                2 * 1022 * 5120 * 2 + 1022 * 8, 0, scatter_inputs,
                lambda be, a: be.embed_scatter(a[0], a[1], a[2]) if be.name == "hip"
                else a[0].index_copy_(0, a[1], a[2])))
    return out


SWEEP_ROWS = (1024, 2048, 4096, 8192, 16384, 24576, 32768, 49152, 65536)
SWEEP_ROUTES = ("filter", "filter_redux", "filter_g16", "exact_bf16", "default")
BF16_ONLY_ROUTES = ("exact_bf16",)  # the table of scores is bf16's: fp32 calls run filter_g16


def router_bytes(rows: int, es: int) -> int:
    """The fewest bytes a router call moves: logits, both biases, the image flags, weights and ids."""
    return rows * 384 * es + 2 * 384 * 4 + rows + rows * 6 * (4 + 8)


def router_sweep(g: torch.Generator, bw: float, reps: int, rows_list=SWEEP_ROWS, routes=SWEEP_ROUTES) -> dict:
    """The router's routes over row counts (384 experts, top-6, both dtypes), the hip side only,
    each as a share of the copy roofline measured in this run: where the default's choice by row
    count should switch (`crossover`: per dtype, the fastest named route at each row count)."""
    table: dict = {}
    for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        es = torch.finfo(dt).bits // 8
        for rows in rows_list:
            nbytes = router_bytes(rows, es)
            n_sets = sets_for(nbytes)
            sets = [((torch.randn(rows, 384, generator=g, device="cuda") * 2.0).to(dt),
                     torch.randn(384, generator=g, device="cuda"), torch.randn(384, generator=g, device="cuda"),
                     torch.arange(rows, device="cuda") % 2 == 1) for _ in range(n_sets)]
            roof_us = nbytes / (bw * 1e9) * 1e6
            wave = variant(router_threads="wave").moe_route(*sets[0], 6, 1.5)
            for route in routes:
                if route in BF16_ONLY_ROUTES and dt != torch.bfloat16:
                    continue
                be = variant(router_threads=0 if route == "default" else route)
                us = graph_us(lambda i, be=be, s=sets: be.moe_route(*s[i], 6, 1.5), n_sets, reps)
                w, ids = be.moe_route(*sets[0], 6, 1.5)
                table.setdefault(f"{tag}/{rows}", {})[route] = {
                    "us": us, "pct_roofline": 100 * roof_us / us, "roofline_us": roof_us,
                    "bitwise_equal_wave_route": bool(torch.equal(ids, wave[1])
                                                     and torch.equal(w.view(torch.int32), wave[0].view(torch.int32)))}
            del sets
            torch.cuda.empty_cache()
    crossover = {}
    for key, by in table.items():
        named = {r: v["us"] for r, v in by.items() if r != "default"}
        crossover[key] = min(named, key=named.get)
    return {"rows": list(rows_list), "routes": list(routes), "table": table, "fastest": crossover}


def router_best(rows: list) -> dict:
    """Per router size and dtype ("f32/65536rows"): the fastest named route and every route's us."""
    by: dict = {}
    for r in rows:
        name = r["kernel"]
        if name.startswith("moe_route/") and "@" in name and name.count("/") == 2:
            size, route = name[len("moe_route/"):].split("@")
            by.setdefault(size, {})[route] = r["hip_us"]
    return {size: {"route": min(us, key=us.get), "hip_us": min(us.values()), "all_us": us} for size, us in by.items()}


def only_refused(only: str | None) -> str | None:
    """Why `--only` would measure nothing (one line), or None. A router route is named after `@`
    (moe_route/f32/65536rows@wave_lb): one the kernel does not have is said so by name."""
    if not only:
        return None
    names = [c[0] for c in cases(torch.Generator())]  # names only: no input is made, nothing runs
    if any(only in n for n in names):
        return None
    m = re.fullmatch(r"(moe_route[^@]*)?@(\w+)", only)  # a route asked for, not a block width (@64t)
    route = m.group(2) if m and not re.fullmatch(r"\d+t", m.group(2)) else None
    if route is not None and route not in ROUTER_ROUTES:
        return (f"--only {only!r}: {route!r} is not a router route (routes: {', '.join(ROUTER_ROUTES)}; "
                "removed routes are listed in hip/README.md)")
    return f"--only {only!r} matches no kernel case (e.g. rms_norm/bf16, moe_route/f32/65536rows@wave_lb)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-kernels.json")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default=None, help="substring of the kernel names to run")
    ap.add_argument("--router-sweep", action="store_true",
                    help="also time the router's filter routes and the default at 1k..64k rows (router_sweep)")
    ap.add_argument("--profile", action="store_true",
                    help="run each case a few times untimed (for a profiler such as ncu) and exit")
    args = ap.parse_args(argv)
    bad = only_refused(args.only)
    if bad:  # before the GPU: a run that would measure nothing is refused on any machine
        print(f"bench/kernels.py: {bad}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    hip, ref = HipBackend(), TorchBackend()
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    if args.profile:
        for name, _, _, _, make, call in cases(g):
            if not args.only or args.only in name:
                a = make()
                for _ in range(3):
                    call(hip, a)
                    call(ref, a)
        torch.cuda.synchronize()
        return 0
    bw = copy_bandwidth(args.reps)
    floor_us = launch_floor_us(args.reps)
    rows = []
    for name, shape, nbytes, flops, make, call in cases(g):
        if args.only and args.only not in name:
            continue
        n_sets = sets_for(nbytes)
        sets = [make() for _ in range(n_sets)]
        hip_call = lambda i, c=call, s=sets: c(hip, s[i])  # noqa: E731
        ref_call = lambda i, c=call, s=sets: c(ref, s[i])  # noqa: E731
        t_hip, clock_hip = graph_us(hip_call, n_sets, args.reps), sm_clock_mhz()
        t_ref, clock_ref = graph_us(ref_call, n_sets, args.reps), sm_clock_mhz()
        roof_us = nbytes / (bw * 1e9) * 1e6
        row = {
            "kernel": name, "shape": shape, "bytes": nbytes, "input_sets": n_sets,
            "sm_clock_mhz_after": [clock_hip, clock_ref],
            "hip_us": t_hip, "torch_us": t_ref,
            "hip_GBps": nbytes / (t_hip * 1e-6) / 1e9, "torch_GBps": nbytes / (t_ref * 1e-6) / 1e9,
            "roofline_us": roof_us,
            "hip_pct_roofline": 100 * roof_us / t_hip, "torch_pct_roofline": 100 * roof_us / t_ref,
            "speedup_vs_eager": t_ref / t_hip,
            # what the kernel is held to: the copy roofline, or one launch's latency where the
            # roofline is below it (1,024 router rows: 0.4 us of bytes, no kernel ends that soon)
            "bound": "launch latency" if roof_us < floor_us else "copy roofline",
            "hip_pct_of_bound": 100 * max(roof_us, floor_us) / t_hip,
            "hip_loop_us": loop_us(hip_call, n_sets, args.reps), "torch_loop_us": loop_us(ref_call, n_sets, args.reps),
        }
        if name.startswith("moe_route/"):
            row.update(router_agreement(call, hip, ref, variant(router_threads="wave"), sets[0]))
        if flops:
            row["hip_TFLOPs"] = flops / (t_hip * 1e-6) / 1e12
            row["torch_TFLOPs"] = flops / (t_ref * 1e-6) / 1e12
        rows.append(row)
        del sets
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_GBps": bw, "launch_floor_us": floor_us, "reps": args.reps, "kernels": rows,
              "router_best": router_best(rows)}
    if args.router_sweep:
        result["router_sweep"] = router_sweep(g, bw, args.reps)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{result['device']}  torch {result['torch']}  copy {bw:.0f} GB/s (read+write), "
          f"one graph-replayed launch of a 1-element kernel {floor_us:.2f} us")
    print(f"{'kernel':28} {'hip us':>8} {'eager us':>9} {'hip GB/s':>9} {'%roof':>6} {'eager %roof':>11} "
          f"{'speedup':>8} {'hip loop':>9} {'eager loop':>10}")
    for r in rows:
        extra = f"  {r['hip_TFLOPs']:.1f} vs {r['torch_TFLOPs']:.1f} TFLOP/s" if "hip_TFLOPs" in r else ""
        print(f"{r['kernel']:28} {r['hip_us']:8.2f} {r['torch_us']:9.2f} {r['hip_GBps']:9.0f} "
              f"{r['hip_pct_roofline']:6.1f} {r['torch_pct_roofline']:11.1f} {r['speedup_vs_eager']:8.2f} "
              f"{r['hip_loop_us']:9.2f} {r['torch_loop_us']:10.2f}{extra}")
    for size, b in result["router_best"].items():
        print(f"router {size}: fastest route {b['route']} {b['hip_us']:.2f} us; "
              + ", ".join(f"{k} {v:.2f}" for k, v in b["all_us"].items()))
    for r in rows:
        if r["kernel"].startswith("moe_route/") and (r["rows_differing_from_torch"] or not r["bitwise_equal_wave_route"]):
            print(f"  {r['kernel']}: {r['rows_differing_from_torch']} rows' ids differ from torch's; bit for bit "
                  f"the wave route's: {r['bitwise_equal_wave_route']}")
    sweep = result.get("router_sweep")
    if sweep:
        print(f"router sweep (us, % of the copy roofline): {'':10}" + "".join(f"{r:>22}" for r in sweep["routes"]))
        for key, by in sweep["table"].items():
            print(f"  {key:12} fastest {sweep['fastest'][key]:13}" + "".join(  # a bf16-only route leaves a gap
                f"{v['us']:10.2f} {v['pct_roofline']:5.1f}%{'' if v['bitwise_equal_wave_route'] else ' !='}"
                if v else f"{'-':>17}" for v in (by.get(r) for r in sweep["routes"])))
    for r in rows:
        if r["bound"] == "launch latency":
            print(f"  {r['kernel']}: its copy roofline ({r['roofline_us']:.2f} us) is below one launch "
                  f"({floor_us:.2f} us): latency-bound, it cannot reach 30% of the roofline; "
                  f"{r['hip_pct_of_bound']:.0f}% of the launch floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
