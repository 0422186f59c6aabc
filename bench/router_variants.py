"""The router's bf16 table route (exact_bf16) built with its compile-time knobs, timed beside the
shipped routes in one run: which knob pays at 65,536 and 1,024 rows x 384 experts top-6.

    python bench/router_variants.py OUTDIR [--rows 65536 1024] [--reps 20] [--nvcc nvcc]

Each variant is hip/moe_route.hip compiled by nvcc alone into a shared library (its C entry
point td_moe_route, called through ctypes on torch's current stream), with -D flags of
moe_route.hip (session 7 measured prefetching the next row block, biases in shared memory,
a branch-free lookup and unrolled rounds this way; VARIANTS holds what is left to compare); the timing is bench/kernels.py's (CUDA-graph replay after a warm-up,
inputs rotated over >= 256 MB). Every variant's ids and weights are held bit for bit to the wave
route of the same library: a variant is only worth its time if it computes the same thing.
Writes OUTDIR/router_variants.json and prints one line a variant and size.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernels import copy_bandwidth, graph_us, router_bytes, sets_for  # noqa: E402

HIP = Path(__file__).resolve().parents[1] / "hip"
TD_BF16 = 1
# name -> (-D flags, route code): the shipped routes first, then exact_bf16's knobs
VARIANTS = {
    "filter_g16": ([], -11),
    "filter_redux": ([], -7),
    "exact_bf16": ([], -13),
}


def build(nvcc: str, flags: list[str], out: Path) -> tuple[ctypes.CDLL | None, str]:
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    cmd = [nvcc, "-x", "cu", f"-arch={arch}", "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC",
           "-Xptxas", "-v", *flags, f"-I{HIP}", str(HIP / "moe_route.hip"), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None, r.stderr[-2000:]
    # the table route's kernel: registers and shared memory as ptxas reports them
    lines = r.stderr.splitlines()
    info = next((lines[i + 2].strip() + "; " + lines[i + 3].strip() for i, ln in enumerate(lines[:-3])
                 if "Compiling entry function" in ln and "Li1ELi24ELb0ELi16ELb1E" in ln), "")
    lib = ctypes.CDLL(str(out))
    lib.td_moe_route.restype = ctypes.c_int
    lib.td_moe_route.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                                                          ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib, info


def call(lib, code: int, a) -> tuple[torch.Tensor, torch.Tensor]:
    logits, bias, bias_vl, image = a
    rows = logits.shape[0]
    w = torch.empty(rows, 6, device="cuda")
    ids = torch.empty(rows, 6, dtype=torch.int64, device="cuda")
    rc = lib.td_moe_route(logits.data_ptr(), bias.data_ptr(), bias_vl.data_ptr(), image.data_ptr(), w.data_ptr(),
                          ids.data_ptr(), rows, 384, 6, 1.5, TD_BF16, 0, code, torch.cuda.current_stream().cuda_stream)
    if rc != 0:
        raise RuntimeError(f"td_moe_route returned {rc}")
    return w, ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, nargs="+", default=[65536, 1024])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.version.cuda is None:
        print("bench/router_variants.py: needs a CUDA GPU and nvcc", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(VARIANTS)
    tmp = Path(tempfile.mkdtemp(prefix="router-variants-"))
    with ThreadPoolExecutor(8) as ex:  # one nvcc a variant, in parallel
        built = dict(zip(names, ex.map(lambda n: build(args.nvcc, VARIANTS[n][0], tmp / f"lib{abs(hash(n))}.so"),
                                       names)))
    g = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth(10)
    result: dict = {"copy_gbs": bw, "variants": {}}
    print(f"copy {bw:.0f} GB/s")
    for rows in args.rows:
        nbytes = router_bytes(rows, 2)
        n_sets = sets_for(nbytes)
        sets = [((torch.randn(rows, 384, generator=g, device="cuda") * 2.0).to(torch.bfloat16),
                 torch.randn(384, generator=g, device="cuda"), torch.randn(384, generator=g, device="cuda"),
                 (torch.arange(rows, device="cuda") % 2 == 1).view(torch.uint8)) for _ in range(n_sets)]
        roof_us = nbytes / (bw * 1e9) * 1e6
        for name in names:
            lib, info = built[name]
            key = f"{name}/{rows}"
            if lib is None:
                result["variants"][key] = {"error": info}
                print(f"{key:34} build failed: {info.splitlines()[-1] if info else ''}")
                continue
            code = VARIANTS[name][1]
            us = graph_us(lambda i, lib=lib, code=code: call(lib, code, sets[i]), n_sets, args.reps)
            w, ids = call(lib, code, sets[0])
            w0, ids0 = call(lib, -1, sets[0])
            same = bool(torch.equal(ids, ids0) and torch.equal(w.view(torch.int32), w0.view(torch.int32)))
            result["variants"][key] = {"us": us, "pct_roofline": 100 * roof_us / us, "bitwise_equal_wave_route": same,
                                       "ptxas": info}
            print(f"{key:34} {us:8.2f} us {100 * roof_us / us:5.1f}% of the copy roofline  "
                  f"{'= wave' if same else 'DIFFERS from wave'}  {info}")
        del sets
        torch.cuda.empty_cache()
    (out / "router_variants.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
