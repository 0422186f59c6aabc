"""A grid of Triton flash-attention configs beside SDPA's kernels, in one process, at the towers' shapes.

    python bench/attention_sweep.py OUTDIR                 # GPU: DeepSeek (16 x 8,910 x 64) and Qwen3-VL (16 x 2,728 x 72), bf16
    python bench/attention_sweep.py OUTDIR --small         # CPU smoke: tiny shapes through Triton's interpreter, fp32

Writes OUTDIR/attention_sweep.json. Per shape: SDPA with cuDNN, flash and efficient alone (what
the engine's kernel order can choose) and every config of `engine/runtime/triton_attention.py`'s
kernels in `GRID` (v1, tuned, and where this Triton has them tuned_ws with warp specialisation,
tuned_tma / tuned_tma_ws with tensor descriptors): ms per call
(CUDA events, median of 3 runs of `--reps` calls after a compile-and-warm call), TFLOP/s at the
real head dim (4 N^2 hd per head: Qwen's 72 counted as 72, so padding shows as lost speed), and
max |o - ref| against SDPA's math kernel in fp32 on the same operands. A config is `ok` when that
error is at most twice the worst SDPA kernel's (+1e-5): a kernel that drops a mask or a scale is
off by orders more. `best_triton` is the fastest ok config, with its ratio to cuDNN
(`triton_over_cudnn`, < 1 beats it). q, k, v are strided views of one [N, 3, H, hd] tensor, as the
towers' qkv GEMM leaves them. A config that fails to compile or run is recorded with its error;
`--budget-s` stops trying new configs (recorded as skipped; two thirds of it for DeepSeek's shape,
configs in order of likelihood) so the sweep fits a GPU session. Each shape's kernels run in a
worker process: a config that faults the device (an illegal access poisons the CUDA context) or
hangs past CONFIG_TIMEOUT_S is recorded as such and a fresh worker takes the configs left, so one
bad config cannot fail the others; MAX_FAULTS_IN_A_ROW faults in a row skip the shape's rest.
Exit 0 when the sweep ran (a slow kernel is a figure), 1 when no SDPA kernel ran, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.runtime.delegate import per_call_ms  # noqa: E402  (the engine's own timer: one way to time a call)

# (BLOCK_M, BLOCK_N, num_warps, num_stages, variant), the likeliest first (a spent time budget
# skips the tail): the shapes Hopper flash kernels use at head dim 64, then the rest of the grid
_LIKELY = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 3)]
# 64-row query blocks first: (64, 64, 4, 3, "tuned") was the fastest at DeepSeek's shape (0.706 ms
# against 0.77 ms for the best 128-row block on an H200)
_SMALL_M = [(64, bn, w, st) for bn in (64, 32, 128) for w in (4, 8) for st in (3, 4, 2, 5)]
GRID = (
    [(*c, "tuned") for c in _SMALL_M]
    + [(64, 64, 4, 3, "tuned_ws"), (64, 64, 4, 4, "tuned_ws"), (32, 64, 4, 3, "tuned"), (32, 64, 2, 3, "tuned")]
    + [(*c, "tuned") for c in _LIKELY]
    + [(*c, v) for v in ("tuned_tma", "tuned_ws", "tuned_tma_ws") for c in _LIKELY]
    + [(128, 64, 4, 3, "v1"), (128, 128, 8, 3, "v1")]
    + [(128, bn, w, st, "tuned") for bn in (64, 128) for w in (4, 8) for st in (2, 3, 4)
       if (128, bn, w, st) not in _LIKELY]
    + [(256, 64, 8, 2, "tuned"), (256, 64, 8, 3, "tuned")]
)
SMALL_GRID = [(32, 32, 4, 2, "v1"), (32, 32, 4, 2, "tuned"), (64, 32, 4, 2, "tuned"), (32, 32, 4, 2, "tuned_ws"),
              (32, 32, 4, 2, "tuned_tma"), (32, 32, 4, 2, "tuned_tma_ws")]
SHAPES = {"deepseek": (16, 8910, 64), "qwen": (16, 2728, 72)}
SMALL_SHAPES = {"deepseek": (2, 150, 64), "qwen": (2, 90, 72)}


def operands(heads: int, n: int, hd: int, dtype, device, seed: int = 0):
    """q, k, v as [1, H, N, hd] strided views of one [N, 3, H, hd] tensor (the qkv GEMM's output)."""
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(n, 3, heads, hd, generator=g, device=device).to(dtype)
    return tuple(qkv[:, i].transpose(0, 1).unsqueeze(0) for i in range(3))


def run_worker(name: str, shape, configs, with_sdpa: bool, args, device, dtype) -> int:
    """One shape in this process: SDPA's kernels (with_sdpa) then each Triton config, one JSON
    line per kernel on stdout ("@@start LABEL" before each, so the parent knows what hung or
    crashed). A device fault (an illegal access poisons the CUDA context for every later call)
    ends the worker with exit 3 after its line; the parent starts a fresh one for the rest."""
    heads, n, hd = shape
    q, k, v = operands(heads, n, hd, dtype, device)
    flops = 4.0 * heads * n * n * hd
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())

    plant = os.environ.get("ATTENTION_SWEEP_PLANT", "")  # "fault:LABEL" or "die:LABEL", for the sweep's tests

    def emit(label, entry):
        print("@@" + json.dumps({"label": label, "entry": entry}), flush=True)

    def run(label, fn, kind, config=None) -> bool:
        print(f"@@start {label}", flush=True)
        entry = {"kind": kind} | ({"config": list(config)} if config else {})
        if plant == f"die:{label}":  # the process dies on this config (tests/bench/test_attention_sweep.py)
            os._exit(1)
        try:
            if plant == f"fault:{label}":
                raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")
            o = fn()
            entry["max_abs_vs_fp32"] = float((o.float() - ref).abs().max())
            entry["ms"] = per_call_ms(fn, device, args.reps)
            entry["tflops"] = flops / (entry["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - a config this GPU or Triton cannot run: a figure
            text = str(e).strip()
            entry["error"] = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]
        fault = "error" in entry and any(w in entry["error"] for w in ("illegal", "CUDA error", "AcceleratorError",
                                                                        "unspecified launch failure"))
        entry["device_fault"] = fault
        emit(label, entry)
        return not fault

    if with_sdpa:
        if device.type == "cuda":
            for kname, enum in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"),
                                ("efficient", "EFFICIENT_ATTENTION")):
                backend = getattr(SDPBackend, enum, None)
                if backend is None:
                    continue

                def call(b=backend):
                    with sdpa_kernel([b]):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
                if not run(f"sdpa_{kname}", call, "sdpa"):
                    return 3
        else:  # the CPU's own SDPA, as the floor for the error criterion
            run("sdpa_cpu", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), "sdpa")
    from engine.runtime import triton_attention as T
    for config in configs:
        if not run("triton " + ",".join(map(str, config)), lambda c=config: T.flash_attention(q, k, v, config=c),
                   "triton", config):
            return 3
    return 0


# a worker silent this long on one config is stopped (a hang, or a compile that will not end)
CONFIG_TIMEOUT_S = 60.0
# this many device faults in a row on one shape and its other configs are not tried (each fault
# costs a fresh process; the same bug faults them all)
MAX_FAULTS_IN_A_ROW = 3


def _worker_cmd(name, configs, with_sdpa, args):
    cmd = [sys.executable, str(Path(__file__).resolve()), "-", "--worker", name, "--configs", json.dumps(configs),
           "--device", args.device, "--reps", str(args.reps)]
    return cmd + (["--small"] if args.small else []) + ([] if with_sdpa else ["--no-sdpa"])


def sweep_shape(name: str, shape, grid, args, device, dtype, deadline: float) -> dict:
    """The shape's kernels, each Triton config in a worker process that a device fault or a hang
    ends without ending the sweep: a fresh worker takes the configs left."""
    import select
    import subprocess

    heads, n, hd = shape
    out: dict = {"shape": {"heads": heads, "tokens": n, "head_dim": hd, "dtype": str(dtype).split(".")[-1]},
                 "flops_per_call": 4.0 * heads * n * n * hd, "kernels": {}, "workers": 0}
    try:
        from engine.runtime import triton_attention as T
    except ImportError as e:
        out["triton"] = f"not importable: {e}"
        T = None
    todo = []
    if T is not None:
        out["triton"] = {"version": __import__("triton").__version__, "warp_specialize": T.WARP_SPECIALIZE,
                         "variants": list(T.VARIANTS)}
        for config in T.candidates(hd, grid):
            if config[4] not in T.VARIANTS:
                out["kernels"]["triton " + ",".join(map(str, config))] = {
                    "kind": "triton", "config": list(config),
                    "skipped": f"this Triton has no {config[4]} (variants {list(T.VARIANTS)})"}
            else:
                todo.append(list(config))
    with_sdpa, faults_in_a_row = True, 0
    while (with_sdpa or todo) and time.monotonic() < deadline and faults_in_a_row < MAX_FAULTS_IN_A_ROW:
        out["workers"] += 1
        proc = subprocess.Popen(_worker_cmd(name, todo if T is not None else [], with_sdpa, args),
                                stdout=subprocess.PIPE, bufsize=0, env=os.environ.copy())
        current, last, pending, lines, ended = None, time.monotonic(), b"", [], False
        while True:
            if not lines:  # unbuffered reads: select then sees every byte the worker has written
                if ended:
                    break
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if not ready:
                    hung = time.monotonic() - last > CONFIG_TIMEOUT_S
                    if hung or time.monotonic() > deadline:
                        proc.kill()
                        if current is not None:
                            kind = "triton" if current.startswith("triton") else "sdpa"
                            out["kernels"][current] = (
                                {"kind": kind, "error": f"timed out ({CONFIG_TIMEOUT_S:.0f} s a config)"} if hung
                                else {"kind": kind, "skipped": "sweep time budget spent (stopped mid-config)"})
                            print(f"{name:9s} {current:34s} {'timed out' if hung else 'budget spent'}", flush=True)
                        break
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                ended = not chunk
                pending += chunk
                *done_lines, pending = pending.split(b"\n")
                lines += [x.decode(errors="replace") + "\n" for x in done_lines]
                if ended and pending:
                    lines.append(pending.decode(errors="replace"))
                continue
            line = lines.pop(0)
            last = time.monotonic()
            if line.startswith("@@start "):
                current = line[len("@@start "):].strip()
            elif line.startswith("@@"):
                r = json.loads(line[2:])
                label, entry = r["label"], r["entry"]
                out["kernels"][label] = entry
                current = None
                faults_in_a_row = faults_in_a_row + 1 if entry.get("device_fault") else 0
                status = (f"{entry['ms']:8.3f} ms {entry['tflops']:6.0f} TFLOP/s |o-ref| "
                          f"{entry['max_abs_vs_fp32']:.2e}" if "ms" in entry else entry["error"])
                print(f"{name:9s} {label:34s} {status}", flush=True)
                if time.monotonic() > deadline and not label.startswith("sdpa_"):  # the rest: skipped below
                    proc.kill()
                    break
            else:
                print(line, end="", flush=True)
        rc = proc.wait()
        if current is not None and current not in out["kernels"]:  # died on it with no line: a crash
            out["kernels"][current] = {"kind": "triton" if current.startswith("triton") else "sdpa",
                                       "error": f"the worker process died on it (exit {rc})", "device_fault": True}
            faults_in_a_row += 1
            print(f"{name:9s} {current:34s} worker died (exit {rc})", flush=True)
        with_sdpa = False
        done = set(out["kernels"])
        todo = [c for c in todo if "triton " + ",".join(map(str, c)) not in done]
        if rc == 0 and not todo:
            break
    for c in todo:
        out["kernels"]["triton " + ",".join(map(str, c))] = {
            "kind": "triton", "config": c,
            "skipped": ("sweep time budget spent" if faults_in_a_row < MAX_FAULTS_IN_A_ROW
                        else f"{MAX_FAULTS_IN_A_ROW} configs in a row faulted the device")}

    errors = {k: e["max_abs_vs_fp32"] for k, e in out["kernels"].items() if "ms" in e}
    sdpa_errors = [errors[k] for k in errors if k.startswith("sdpa_")]
    floor = max(sdpa_errors) if sdpa_errors else None
    out["error_floor"] = floor
    for label, e in out["kernels"].items():
        if "max_abs_vs_fp32" in e:
            e["ok"] = floor is not None and e["max_abs_vs_fp32"] <= 2 * floor + 1e-5
    ok = {k: e for k, e in out["kernels"].items() if e.get("ok")}
    tri = {k: e["ms"] for k, e in ok.items() if e["kind"] == "triton"}
    sdpa = {k: e["ms"] for k, e in ok.items() if e["kind"] == "sdpa"}
    if tri:
        best = min(tri, key=tri.get)
        out["best_triton"] = {"label": best, "config": ok[best]["config"], "ms": tri[best], "tflops": ok[best]["tflops"]}
    if sdpa:
        out["best_sdpa"] = min(sdpa, key=sdpa.get)
    cudnn = ok.get("sdpa_cudnn", {}).get("ms")
    if tri and cudnn:
        out["triton_over_cudnn"] = tri[out["best_triton"]["label"]] / cudnn
    out["failed_configs"] = sorted(k for k, e in out["kernels"].items() if "error" in e)
    out["faulted_configs"] = sorted(k for k, e in out["kernels"].items() if e.get("device_fault"))
    out["wrong_configs"] = sorted(k for k, e in out["kernels"].items() if e.get("ok") is False)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes and a few configs (a CPU smoke run)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop trying new Triton configs after this")
    ap.add_argument("--only", choices=sorted(SHAPES), action="append", default=[])
    ap.add_argument("--worker", choices=sorted(SHAPES), help=argparse.SUPPRESS)  # one shape, in a child process
    ap.add_argument("--configs", default="[]", help=argparse.SUPPRESS)
    ap.add_argument("--no-sdpa", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("attention_sweep: --device cuda but no GPU is visible", file=sys.stderr)
        return 2
    if device.type == "cpu" and not args.small:
        print("attention_sweep: the full shapes need a GPU (use --small on the CPU)", file=sys.stderr)
        return 2
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is imported: before the first import below
    if not args.worker:
        args.out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = SMALL_SHAPES if args.small else SHAPES
    if args.worker:
        return run_worker(args.worker, shapes[args.worker], [tuple(c) for c in json.loads(args.configs)],
                          not args.no_sdpa, args, device, dtype)
    grid = SMALL_GRID if args.small else GRID
    res: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "torch": torch.__version__, "small": args.small, "reps": args.reps, "budget_s": args.budget_s,
                 "shapes": {}}
    path = args.out / "attention_sweep.json"
    names = args.only or list(shapes)
    share = {"deepseek": 2.0, "qwen": 1.0}  # DeepSeek's shape carries the tower's target: most of the time
    start, spent = time.monotonic(), 0.0
    for name in names:
        spent += share[name] / sum(share[n] for n in names)
        deadline = start + args.budget_s * spent  # what a shape leaves unspent passes to the next
        res["shapes"][name] = sweep_shape(name, shapes[name], grid, args, device, dtype, deadline)
        path.write_text(json.dumps(res, indent=1) + "\n")  # after each shape: a stopped run keeps what it did
        torch.cuda.empty_cache() if device.type == "cuda" else None
    for name, r in res["shapes"].items():
        b = r.get("best_triton")
        ratio = r.get("triton_over_cudnn")
        print(f"{name}: best triton {b['label'] if b else None} "
              f"{'%.3f ms %.0f TFLOP/s' % (b['ms'], b['tflops']) if b else ''}; best sdpa {r.get('best_sdpa')}; "
              f"triton/cudnn {ratio if ratio is None else round(ratio, 3)}; "
              f"failed {len(r.get('failed_configs', []))}, wrong {len(r.get('wrong_configs', []))}")
    print(f"wrote {path}")
    return 0 if all(r.get("best_sdpa") for r in res["shapes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
