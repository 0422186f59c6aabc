"""Benchmark: `compare_dumps` throughput and peak memory, against reading alone and the naive route.

    python bench/compare_throughput.py                      # ~2.2 GB of dumps in a temp dir
    python bench/compare_throughput.py --dir /tmp/tdbench --size-mb 2200 --json bench.json

Two dumps are written (A, and B = A plus a few ULP of noise) with DeepSeek-vision-like boundary
shapes: fp32 patches, rope tables, a bf16-against-fp32 block0 (the mixed-precision case), bf16
final_norm, a wide fp32 aligner and integer router ids. Then each route runs in its own
subprocess, so that `ru_maxrss` is the peak of that route alone:

- read:    the comparator's own streaming (readers, chunks, worker threads, page release), every
           byte read (a max over the raw bytes), no metrics; `read1`: the same on one thread
- compare: `tensordiff.compare_dumps(A, B)`
- naive:   every tensor loaded whole into torch (`safetensors.torch.load_file`), then
           `torch.testing.assert_close`-style math: abs diff, allclose mask, max rel, RMSE, cosine

Before every measurement all dump files are read once, so each route starts page-cache warm
(`--cold` adds a second series with the files dropped from the cache by
`posix_fadvise(DONTNEED)`, which is best effort). Wall times exclude interpreter start and
imports; RSS includes them (`rss_after_import_mb` says how much that is). CPU seconds (user +
system, all threads) are reported beside wall time: on a shared machine they are the stable
figure, and their ratio is what the comparator costs over reading.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_RATIO = 1.5
TARGET_RSS_MB = 1024
SPEC_FILE = "bench-spec.json"
# bytes per patch row, both sides: patches, rope, block0 (fp32 | bf16), final_norm, aligner, router ids
BYTES_PER_N = (2352 + 256 + 4096 + 2048 + 5120 + 8) + (2352 + 256 + 2048 + 2048 + 5120 + 8)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (finite inputs)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _torch_bf16(bits: np.ndarray):
    import torch

    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def _tensors(n: int, side: str):
    """Yield (name, array-or-torch-tensor) for one side; B is A plus a few ULP of noise."""
    tokens = max(1, n // 4)

    def rng(name: str, noise: bool = False):
        seed = [sum(name.encode()), len(name), int(noise)]
        return np.random.default_rng(seed)

    def near(a: np.ndarray, name: str, rel: float) -> np.ndarray:
        if side == "a":
            return a
        e = rng(name, True).standard_normal(a.shape, dtype=np.float32)
        e *= rel
        e += 1
        e *= a
        return e

    # patches: [N, 588] pixel rows in [-1, 1]
    p = np.clip(rng("patches").standard_normal((n, 588), dtype=np.float32) * 0.5, -1, 1)
    yield "patches", np.clip(near(p, "patches", 2e-7), -1, 1)
    del p
    ang = rng("rope").uniform(0, 64, (n, 32)).astype(np.float32)
    yield "rope.cos", near(np.cos(ang), "rope.cos", 2e-7)
    yield "rope.sin", near(np.sin(ang), "rope.sin", 2e-7)
    del ang
    # block0: [N, 1024]; the engine side runs in bf16 (the common mixed-precision case)
    x = rng("block0").standard_normal((n, 1024), dtype=np.float32)
    yield "block0", x if side == "a" else _torch_bf16(_bf16(near(x, "block0", 1e-3)))
    del x
    x = rng("final_norm").standard_normal((n, 1024), dtype=np.float32)
    yield "final_norm", _torch_bf16(_bf16(near(x, "final_norm", 2e-3)))
    del x
    # aligner: [tokens, 5120] fp32
    x = rng("aligner").standard_normal((tokens, 5120), dtype=np.float32) * 0.05
    yield "aligner", near(x, "aligner", 3e-7)
    del x
    ids = np.argsort(rng("router").random((tokens, 64)), axis=1)[:, :8].astype(np.int32)
    yield "router.0.ids", ids


def generate(root: Path, size_mb: float) -> dict:
    """Write dumps A and B under `root` (reused when a previous run wrote the same size)."""
    from tensordiff import Recorder

    n = max(4, int(size_mb * 1e6 / BYTES_PER_N) // 4 * 4)
    spec = {"n": n, "size_mb": size_mb, "version": 1}
    sf = root / SPEC_FILE
    if sf.is_file() and json.loads(sf.read_text()) == spec and (root / "a" / "manifest.json").is_file() \
            and (root / "b" / "manifest.json").is_file():
        return spec
    for side in ("a", "b"):
        shutil.rmtree(root / side, ignore_errors=True)
    sf.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    for side in ("a", "b"):
        producer = {"name": "bench", "side": "oracle" if side == "a" else "engine"}
        with Recorder(root / side, model="bench-vision", producer=producer,
                      run={"dtype": "float32" if side == "a" else "mixed"}) as rec:
            for name, t in _tensors(n, side):
                rec.record(name, t)
    os.sync()
    sf.write_text(json.dumps(spec))
    return spec


def _files(root: Path) -> list[Path]:
    return sorted(p for side in ("a", "b") for p in (root / side).iterdir() if p.suffix == ".safetensors")


def warm(root: Path) -> None:
    buf = bytearray(8 << 20)
    for p in _files(root):
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def drop_cache(root: Path) -> None:
    for p in _files(root):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------- measured routes (children)

def _rss_mb() -> float:
    """Peak RSS of this process: ru_maxrss (Linux: KiB), and VmHWM where /proc has it (ru_maxrss
    can carry the parent's peak across fork/exec; the driver keeps its own RSS small for that)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return min(peak, int(line.split()[1]) / 1024)
    except OSError:
        pass
    return peak


class _Touch:
    """A do-nothing accumulator for `stream_pair`: reads every byte of each chunk (a max over
    the raw bytes, which is what faults the pages in and streams them through the CPU), the
    cheapest honest read of a mapping."""

    def __init__(self):
        self.nbytes = 0

    def update(self, start: int, xa: np.ndarray, xb: np.ndarray) -> None:
        for x in (xa, xb):
            x.view(np.uint8).max()
            self.nbytes += x.nbytes

    def spawn(self) -> "_Touch":
        return _Touch()

    def merge(self, other: "_Touch") -> None:
        self.nbytes += other.nbytes


def route_read(a: Path, b: Path, workers: int | None = None) -> dict:
    """Stream every tensor pair through the comparator's own machinery (readers, chunks, worker
    threads, page release), reading every byte and computing nothing."""
    from tensordiff import stream
    from tensordiff.dump import open_dump

    da, db = open_dump(a), open_dump(b)
    t0 = time.perf_counter()
    nbytes = 0
    for ea in da.entries:
        eb = db.entry(ea.name)
        row = int(np.prod(ea.shape[1:])) if len(ea.shape) >= 2 else 0
        nbytes += stream.stream_pair(ea.stored, eb.stored, _Touch(), stream.chunk_len(row), workers=workers).nbytes
    return {"wall_s": time.perf_counter() - t0, "bytes": nbytes}


def route_read1(a: Path, b: Path) -> dict:
    """The same read on one thread: what a plain single-threaded reader costs."""
    return route_read(a, b, workers=1)


def route_compare(a: Path, b: Path) -> dict:
    from tensordiff.compare import compare_dumps
    from tensordiff.dump import open_dump

    da, db = open_dump(a), open_dump(b)
    t0 = time.perf_counter()
    rep = compare_dumps(da, db)
    wall = time.perf_counter() - t0
    tensors = [t for br in rep.boundaries for t in br.tensors]
    return {"wall_s": wall, "bytes": da.nbytes + db.nbytes, "verdict": rep.verdict,
            "statuses": {t.name: t.status for t in tensors},
            "cosine": {t.name: t.metrics.get("cosine") for t in tensors if "cosine" in t.metrics}}


def route_naive(a: Path, b: Path) -> dict:
    """Whole tensors in torch: what a test written with torch.testing.assert_close does."""
    import torch
    from safetensors.torch import load_file

    from tensordiff.dump import open_dump
    from tensordiff.tolerance import DEFAULTS

    da, db = open_dump(a), open_dump(b)
    t0 = time.perf_counter()
    out = {}
    files_a = {p.name: p for p in sorted({e.stored.file for e in da.entries})}
    for fname, pa in files_a.items():
        ta, tb = load_file(pa), load_file(db.path / fname)
        for key, x in ta.items():
            y = tb[key]
            if x.is_floating_point():
                work = torch.promote_types(x.dtype, y.dtype)
                narrow = x.dtype if torch.finfo(x.dtype).eps >= torch.finfo(y.dtype).eps else y.dtype
                tol = DEFAULTS[str(narrow).replace("torch.", "")]
                x, y = x.to(work), y.to(work)
                d = (x - y).abs()
                close = d <= tol.atol + tol.rtol * x.abs()
                close |= torch.isnan(x) & torch.isnan(y)
                out[key] = {
                    "max_abs": d.max().item(),
                    "mean_abs": d.double().mean().item(),
                    "max_rel": (d / x.abs().clamp_min(torch.finfo(work).tiny)).max().item(),
                    "rmse": d.double().square().mean().sqrt().item(),
                    "cosine": torch.nn.functional.cosine_similarity(x.double().flatten(), y.double().flatten(), dim=0).item(),
                    "mismatches": int((~close).sum()),
                    "nan": [int(torch.isnan(x).sum()), int(torch.isnan(y).sum())],
                }
            else:
                out[key] = {"mismatches": int((x != y).sum())}
            del x, y
        del ta, tb
    return {"wall_s": time.perf_counter() - t0, "bytes": da.nbytes + db.nbytes, "tensors": len(out)}


ROUTES = {"read": route_read, "read1": route_read1, "compare": route_compare, "naive": route_naive}


def child(route: str, a: str, b: str, out: str) -> None:
    import tensordiff.compare  # noqa: F401  imports are not timed (RSS counts them)

    if route == "naive":
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
    before = _rss_mb()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    res = ROUTES[route](Path(a), Path(b))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    res.update(rss_after_import_mb=before, peak_rss_mb=_rss_mb(),
               cpu_s=(ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime))
    Path(out).write_text(json.dumps(res))


# ----------------------------------------------------------------------------- driver

def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def measure(root: Path, route: str, cold: bool) -> dict:
    (drop_cache if cold else warm)(root)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        subprocess.run([sys.executable, __file__, "--child", route, str(root / "a"), str(root / "b"), out],
                       check=True, env=_env())
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def series(root: Path, routes: list[str], repeat: dict[str, int], cold: bool) -> dict:
    """Runs the routes interleaved (read, compare, read, compare, ...) so that a machine shared
    with other work loads each route alike; ratios are also taken run by run."""
    runs: dict[str, list[dict]] = {r: [] for r in routes}
    for i in range(max(repeat.values())):
        for route in routes:
            if i < repeat[route]:
                runs[route].append(measure(root, route, cold))
    res: dict = {}
    for route in routes:
        walls = [r["wall_s"] for r in runs[route]]
        best = min(walls)
        first = runs[route][0]
        res[route] = {"wall_s": best, "wall_s_median": statistics.median(walls), "wall_s_all": walls,
                      "cpu_s": min(r["cpu_s"] for r in runs[route]), "gb_per_s": first["bytes"] / best / 1e9,
                      "bytes": first["bytes"], "peak_rss_mb": max(r["peak_rss_mb"] for r in runs[route]),
                      "rss_after_import_mb": max(r["rss_after_import_mb"] for r in runs[route])}
        if route == "compare":
            res[route]["verdict"] = first["verdict"]
            res[route]["statuses"] = first["statuses"]
    if "read" in runs and "compare" in runs:
        pairs = [c["wall_s"] / r["wall_s"] for r, c in zip(runs["read"], runs["compare"])]
        res["ratio_run_by_run"] = {"min": min(pairs), "median": statistics.median(pairs), "all": pairs}
    res["loadavg_1m_after"] = os.getloadavg()[0]
    if "read" in res and "compare" in res:
        res["ratio_compare_to_read"] = res["compare"]["wall_s"] / res["read"]["wall_s"]
        res["ratio_compare_to_read_median"] = res["compare"]["wall_s_median"] / res["read"]["wall_s_median"]
        res["cpu_ratio_compare_to_read"] = res["compare"]["cpu_s"] / max(res["read"]["cpu_s"], 1e-9)
    if "read1" in res and "compare" in res:
        res["ratio_compare_to_read1"] = res["compare"]["wall_s"] / res["read1"]["wall_s"]
    if "naive" in res and "compare" in res:
        res["speedup_vs_naive"] = res["naive"]["wall_s"] / res["compare"]["wall_s"]
    return res


def _kernel_status() -> str:
    """Which float path the children use (asked in a child, like the measurements)."""
    code = "from tensordiff import native; native.float_kernel(); print(native.status)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env()).stdout.strip()


def table(name: str, s: dict) -> str:
    lines = [f"{name}:", f"  {'route':8} {'wall s':>8} {'median':>8} {'GB/s':>7} {'CPU s':>7} {'peak RSS MB':>12} {'(imports)':>10}"]
    for route in ROUTES:
        if route in s:
            r = s[route]
            lines.append(f"  {route:8} {r['wall_s']:8.3f} {r['wall_s_median']:8.3f} {r['gb_per_s']:7.2f} {r['cpu_s']:7.2f} "
                         f"{r['peak_rss_mb']:12.0f} {r['rss_after_import_mb']:10.0f}")
    if "ratio_compare_to_read" in s:
        ok = s["ratio_compare_to_read"] <= TARGET_RATIO
        lines.append(f"  compare / read = {s['ratio_compare_to_read']:.2f}x best / best, "
                     f"{s['ratio_compare_to_read_median']:.2f}x median / median (target <= {TARGET_RATIO}x: "
                     f"{'met' if ok else 'NOT met'})")
    if "ratio_run_by_run" in s:
        rr = s["ratio_run_by_run"]
        lines.append(f"  compare / read run by run: min {rr['min']:.2f}x, median {rr['median']:.2f}x")
    if "cpu_ratio_compare_to_read" in s:
        lines.append(f"  CPU time compare / read = {s['cpu_ratio_compare_to_read']:.2f}x")
    if "ratio_compare_to_read1" in s:
        lines.append(f"  compare / read on one thread = {s['ratio_compare_to_read1']:.2f}x")
    if "compare" in s:
        ok = s["compare"]["peak_rss_mb"] < TARGET_RSS_MB
        lines.append(f"  compare peak RSS {s['compare']['peak_rss_mb']:.0f} MB (target < {TARGET_RSS_MB} MB: "
                     f"{'met' if ok else 'NOT met'}); verdict {s['compare']['verdict']}")
    if "speedup_vs_naive" in s:
        lines.append(f"  naive / compare = {s['speedup_vs_naive']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(*argv[1:5])
        return 0
    if argv and argv[0] == "--generate":
        print(json.dumps(generate(Path(argv[1]), float(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, help="where the dumps live (kept, reused when the size matches); "
                                             "default: a temporary directory, removed afterwards")
    ap.add_argument("--size-mb", type=float, default=2200, help="total size of both dumps (default 2200)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per route; the best wall time is reported")
    ap.add_argument("--naive-repeat", type=int, default=1)
    ap.add_argument("--routes", default="read,read1,compare,naive")
    ap.add_argument("--cold", action="store_true", help="also measure with the files dropped from the page cache")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)

    routes = [r for r in args.routes.split(",") if r]
    if unknown := [r for r in routes if r not in ROUTES]:
        ap.error(f"unknown route(s) {unknown}")
    tmp = None
    root = args.dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="tensordiff-bench-")
        root = Path(tmp)
    try:
        t0 = time.perf_counter()
        # in a child: the driver stays small, so its RSS cannot leak into the measured children
        spec = json.loads(subprocess.run([sys.executable, __file__, "--generate", str(root), str(args.size_mb)],
                                         check=True, capture_output=True, text=True, env=_env()).stdout)
        gen_s = time.perf_counter() - t0
        repeat = {r: (args.naive_repeat if r == "naive" else args.repeat) for r in routes}
        from tensordiff import native, stream

        report = {
            "benchmark": "compare_throughput",
            "dumps": {"dir": str(root), "n_patches": spec["n"], "generate_s": gen_s,
                      "bytes": sum(p.stat().st_size for p in _files(root))},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                        "platform": platform.platform()},
            "comparator": {"chunk_elements": stream.CHUNK, "workers": stream.WORKERS,
                           "kernel": _kernel_status()},
            "targets": {"ratio_max": TARGET_RATIO, "peak_rss_mb_max": TARGET_RSS_MB},
            "warm": series(root, routes, repeat, cold=False),
        }
        if args.cold:
            report["cold"] = series(root, routes, repeat, cold=True)
        w = report["warm"]
        report["met"] = {"ratio": w.get("ratio_compare_to_read", float("inf")) <= TARGET_RATIO,
                         "rss": w.get("compare", {}).get("peak_rss_mb", float("inf")) < TARGET_RSS_MB}
        print(f"dumps: {report['dumps']['bytes'] / 1e6:.0f} MB in {root} (N = {spec['n']} patches), "
              f"{os.cpu_count()} CPUs, chunk {stream.CHUNK} elements, {stream.WORKERS} workers, "
              f"float kernel: {report['comparator']['kernel']}")
        print(f"load average (1 min) when done: {w['loadavg_1m_after']:.1f} (other work on the machine slows wall times)")
        print(table("page cache warm (every route after a full read of the files)", w))
        if args.cold:
            print(table("page cache dropped (posix_fadvise DONTNEED, best effort)", report["cold"]))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
