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
- limit:   a plain C pass (bench/limit_maxabs.c) computing max|a-b| over `np.memmap`s of the same
           files on 2 threads: this machine's streaming limit, the big case's baseline (target:
           compare <= 1.5x limit)
- kernel:  the native float kernel alone (tensordiff/judge/native/float_metrics.c, every statistic and
           the percentiles' bins as the comparator counts them: a large tensor's first chunk in a
           full histogram, the rest by cuts, metrics.CUT_MIN) in the limit route's setting, 2 threads on memmapped halves: compare /
           kernel is the comparator's overhead, kernel / limit the kernel's cost over reading;
           `kernel_generic` the same on the kernel's portable path (no AVX-512 intrinsics)
- kernel_fullhist: the kernel route with every chunk in the full histogram (no cuts)
- kernel_nohist: the kernel route with its ULP histogram left out (a benchmark-only switch,
           `native.set_no_hist`): kernel / kernel_nohist is what the two percentiles' bins cost
- verify:  `compare_dumps(A, B, verify=True)` (sha256 of every tensor checked too; target <= 3x compare)
- sha256:  SHA-256 of every tensor's stored bytes alone, one thread a side: verify's floor, so
           verify / sha256 is what verify adds to hashing, and sha256 / compare the least
           verify / compare can be on this machine

Further cases (`--cases`, default all; each measured against its own baseline in the same run):

- many:    N small fp32 tensors [25, 128] per side (N = 100, 1,000, 20,000; 12.8 kB each), in
           safetensors and in HDF5: `compare_dumps` against a minimal numpy script computing the
           same core metrics (`route_numpy`); targets: 20,000 tensors in <= 2 s, faster than the
           script at every N, HDF5 within 1.5x of safetensors
- memory:  one 1.6 GB-per-side fp32 tensor, compared with 1 and 2 worker threads: peak RSS
           (target <= 120 MB at any thread count)
- cli:     `python -m tensordiff.commands.cli compare` on dumps/sample-* (wall time, interpreter start
           included; target <= 0.25 s), beside `python -c "import numpy"`, its floor

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

TARGET_RATIO = 1.5  # compare / limit (the big case)
TARGET_RSS_MB = 1024  # the big case
TARGET_VERIFY = 3.0  # compare --verify / compare
TARGET_MANY_S = 2.0  # 20,000 small tensors
TARGET_HDF5 = 1.5  # HDF5 / safetensors, many small tensors
TARGET_MEMORY_MB = 120  # one 1.6 GB-per-side tensor, any thread count
TARGET_CLI_S = 0.25  # `tensordiff compare` on the sample dumps
MANY_COUNTS = (100, 1_000, 20_000)
MANY_SHAPE = (25, 128)
MEMORY_NUMEL = 400_000_000  # 1.6 GB of fp32 per side
LIMIT_SO_ENV = "TD_BENCH_LIMIT_SO"
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
    return sorted(p for side in ("a", "b") for p in (root / side).iterdir() if p.suffix in (".safetensors", ".h5"))


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
    from tensordiff.format import storage
    from tensordiff.judge import stream
    from tensordiff.format.dump import open_dump

    da, db = open_dump(a), open_dump(b)
    t0 = time.perf_counter()
    nbytes = 0
    with storage.shared_files():  # as compare_dumps: one mapping a file, releases gathered
        for ea in da.entries:
            eb = db.entry(ea.name)
            row = int(np.prod(ea.shape[1:])) if len(ea.shape) >= 2 else 0
            nbytes += stream.stream_pair(ea.stored, eb.stored, _Touch(), stream.chunk_len(row), workers=workers).nbytes
    return {"wall_s": time.perf_counter() - t0, "bytes": nbytes}


def route_read1(a: Path, b: Path) -> dict:
    """The same read on one thread: what a plain single-threaded reader costs."""
    return route_read(a, b, workers=1)


def route_compare(a: Path, b: Path) -> dict:
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.format.dump import open_dump

    da, db = open_dump(a), open_dump(b)
    c0 = _cpu_now()
    t0 = time.perf_counter()
    rep = compare_dumps(da, db)
    wall = time.perf_counter() - t0
    cpu = _cpu_now() - c0  # over the timed span only (opening the dumps is not in it)
    tensors = [t for br in rep.boundaries for t in br.tensors]
    return {"wall_s": wall, "cpu_s": cpu, "bytes": da.nbytes + db.nbytes, "verdict": rep.verdict,
            "statuses": {t.name: t.status for t in tensors},
            "cosine": {t.name: t.metrics.get("cosine") for t in tensors if "cosine" in t.metrics}}


def route_compare_open(a: Path, b: Path) -> dict:
    """`compare_dumps` from the two directories, opening included: what `tensordiff compare` does
    beside its imports and its report (opening validates every manifest entry and, for HDF5,
    reads each dataset's layout through h5py)."""
    from tensordiff.pipeline.compare import compare_dumps

    c0 = _cpu_now()
    t0 = time.perf_counter()
    rep = compare_dumps(a, b)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_now() - c0, "bytes": 0, "verdict": rep.verdict}


def _cpu_now() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def route_naive(a: Path, b: Path) -> dict:
    """Whole tensors in torch: what a test written with torch.testing.assert_close does."""
    import torch
    from safetensors.torch import load_file

    from tensordiff.format.dump import open_dump
    from tensordiff.judge.tolerance import DEFAULTS

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


def _halves(a: Path, b: Path, pair) -> tuple[float, float]:
    """Each tensor pair as np.memmaps of the same files, split in two halves run on two threads:
    pair(x, y, kind_a, kind_b) -> float on each half (ctypes releases the GIL). Returns (wall s,
    max of the results)."""
    import threading

    from tensordiff.format.dump import open_dump

    kinds = {"float32": 0, "bfloat16": 1, "int32": 2}
    da, db = open_dump(a), open_dump(b)
    t0 = time.perf_counter()
    worst = 0.0
    for ea in da.entries:
        eb = db.entry(ea.name)
        n = ea.stored.numel
        ma = np.memmap(ea.stored.file, dtype=ea.dtype.storage, mode="r", offset=ea.stored.offset, shape=(n,))
        mb = np.memmap(eb.stored.file, dtype=eb.dtype.storage, mode="r", offset=eb.stored.offset, shape=(n,))
        ka, kb = kinds[ea.dtype.name], kinds[eb.dtype.name]
        out = [0.0, 0.0]
        half = n // 2

        def part(i: int, x: np.ndarray, y: np.ndarray) -> None:
            out[i] = pair(x, y, ka, kb)

        t = threading.Thread(target=part, args=(1, ma[half:], mb[half:]))
        t.start()
        part(0, ma[:half], mb[:half])
        t.join()
        worst = max(worst, *out)
    return time.perf_counter() - t0, worst


def _limit_fn():
    import ctypes

    f = ctypes.CDLL(os.environ[LIMIT_SO_ENV]).td_limit_maxabs
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
    f.restype = ctypes.c_double
    return f


def route_limit(a: Path, b: Path) -> dict:
    """The streaming limit: max|a-b| in plain C (bench/limit_maxabs.c) over np.memmaps of the same
    files, each tensor split in two halves run on two threads (ctypes releases the GIL)."""
    from tensordiff.format.dump import open_dump

    f = _limit_fn()
    wall, worst = _halves(a, b, lambda x, y, ka, kb: f(x.ctypes.data, ka, y.ctypes.data, kb, x.size))
    return {"wall_s": wall, "bytes": open_dump(a).nbytes + open_dump(b).nbytes, "max_abs": worst}


def route_kernel(a: Path, b: Path, generic: bool = False) -> dict:
    """The native float kernel alone (every FloatMetrics statistic, histogram included) in the
    limit route's setting: np.memmaps, two threads on two halves, in the comparator's chunk size;
    no readers, workers, page release or results. compare / kernel is the comparator's overhead,
    kernel / limit the kernel's cost over reading. Integer tensors (router ids) take the limit's
    pass. `kernel_generic`: the kernel's portable path (TENSORDIFF_NATIVE=generic)."""
    from tensordiff.judge import metrics as M
    from tensordiff.judge import native, stream
    from tensordiff.format.dump import open_dump

    k, kc = native.float_kernel(), native.float_cuts()
    if k is None:
        raise RuntimeError(f"no native kernel: {native.status}")
    native.set_generic(generic)
    lim = _limit_fn()

    def pair(x: np.ndarray, y: np.ndarray, ka: int, kb: int) -> float:
        if 2 in (ka, kb):
            return lim(x.ctypes.data, ka, y.ctypes.data, kb, x.size)
        store = M.STORE0.copy()
        base = store.ctypes.data
        cuts, below = None, np.zeros(M.MAX_CUTS, dtype=np.int64)
        for s in range(0, x.size, stream.CHUNK):
            n = min(stream.CHUNK, x.size - s)
            xa, ya = x.ctypes.data + s * x.itemsize, y.ctypes.data + s * y.itemsize
            if cuts is not None:  # as FloatMetrics: past a first chunk of a large tensor, the cut counts
                rc = kc(xa, ka, ya, kb, n, s, 1e-5, 1.3e-6, 2.0 ** -126, 2.0 ** -23, M._NBINS, None, 0, 0, base,
                        base + 10 * 8, cuts.ctypes.data, cuts.size, below.ctypes.data)
            else:
                rc = k(xa, ka, ya, kb, n, s, 1e-5, 1.3e-6, 2.0 ** -126, 2.0 ** -23, base + 22 * 8, M._NBINS, None, 0,
                       0, base, base + 10 * 8)
                if 2 * x.size >= M.CUT_MIN:  # this half's tensor is CUT_MIN or more elements
                    cuts = M._cuts_around(store[22:], M.PERCENTILES)
            if rc:
                raise RuntimeError(f"native float kernel failed ({rc})")
        return float(store[10:22].view(np.float64)[0])

    wall, worst = _halves(a, b, pair)
    return {"wall_s": wall, "bytes": open_dump(a).nbytes + open_dump(b).nbytes, "max_abs": worst,
            "path": native.status}


def route_kernel_generic(a: Path, b: Path) -> dict:
    return route_kernel(a, b, generic=True)


def route_kernel_nohist(a: Path, b: Path) -> dict:
    """The kernel route with the ULP histogram left out (`native.set_no_hist`, benchmark only):
    kernel / kernel_nohist is what the histogram (two percentiles' worth of bins) costs."""
    from tensordiff.judge import native

    if not native.set_no_hist(True):
        raise RuntimeError(f"no AVX-512 kernel to run without its histogram: {native.status}")
    return route_kernel(a, b)


def route_kernel_fullhist(a: Path, b: Path) -> dict:
    """The kernel route counting every chunk in the full ULP histogram (no cuts: what the kernel
    cost before metrics.CUT_MIN): kernel_fullhist / kernel is what the cuts save."""
    from tensordiff.judge import metrics as M

    M.CUT_MIN = 1 << 62
    return route_kernel(a, b)


def route_verify(a: Path, b: Path) -> dict:
    """`compare_dumps(A, B, verify=True)`: every tensor's sha256 checked as well."""
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.format.dump import open_dump

    da, db = open_dump(a), open_dump(b)
    t0 = time.perf_counter()
    rep = compare_dumps(da, db, verify=True)
    return {"wall_s": time.perf_counter() - t0, "bytes": da.nbytes + db.nbytes, "verdict": rep.verdict}


def route_sha256(a: Path, b: Path) -> dict:
    """The hashing floor under `--verify`: SHA-256 over every tensor's stored bytes, each side on a
    thread of its own (hashlib releases the GIL), no metrics. Verify must hash every byte of both
    sides, so verify / sha256 is what it costs over hashing alone; SHA-256 (OpenSSL, SHA-NI) runs
    at ~1.2 GB/s a core on the 2-core machine, ~6x slower than the comparator's metrics."""
    import hashlib
    import mmap
    import threading

    from tensordiff.format.dump import open_dump

    sides = [open_dump(a), open_dump(b)]
    digests: list[list[str]] = [[], []]

    def side(i: int) -> None:
        for e in sides[i].entries:
            st = e.stored
            if not st.mapped:  # chunked HDF5: read through h5py, as verify does
                import h5py

                with h5py.File(st.file, "r") as h:
                    digests[i].append(hashlib.sha256(h[st.key][()].tobytes()).hexdigest())
                continue
            with open(st.file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                with memoryview(m) as v:
                    digests[i].append(hashlib.sha256(v[st.offset:st.offset + st.nbytes]).hexdigest())

    c0 = _cpu_now()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=side, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": _cpu_now() - c0, "bytes": sides[0].nbytes + sides[1].nbytes,
            "tensors": sum(map(len, digests))}


def route_numpy(a: Path, b: Path) -> dict:
    """A minimal numpy script: every tensor pair loaded whole, the core metrics (max/mean abs, max
    rel, RMSE, cosine, allclose mismatches, NaN counts), nothing else; safetensors or HDF5."""
    import json as _json

    ma = _json.loads((a / "manifest.json").read_text())
    mb = {t["name"]: t for t in _json.loads((b / "manifest.json").read_text())["tensors"]}
    t0 = time.perf_counter()
    files: dict = {}

    def load(root: Path, t: dict) -> np.ndarray:
        key = (root, t["file"])
        if key not in files:
            if t["file"].endswith(".h5"):
                import h5py

                with h5py.File(root / t["file"], "r") as h:
                    files[key] = {k: h[k][()] for k in h}
            else:
                from safetensors.numpy import load_file

                files[key] = load_file(root / t["file"])
        return files[key][t["key"]]

    out = {}
    c0 = _cpu_now()
    for ta in ma["tensors"]:
        x, y = load(a, ta), load(b, mb[ta["name"]])
        if x.dtype.kind == "f":
            d = np.abs(x - y)
            out[ta["name"]] = {
                "max_abs": float(d.max()), "mean_abs": float(d.mean(dtype=np.float64)),
                "max_rel": float((d / np.maximum(np.abs(x), np.finfo(x.dtype).tiny)).max()),
                "rmse": float(np.sqrt(np.mean(np.square(d, dtype=np.float64)))),
                "cosine": float(np.dot(x.ravel(), y.ravel()) / (np.linalg.norm(x) * np.linalg.norm(y))),
                "mismatches": int((d > 1e-4 + 1e-3 * np.abs(x)).sum()),  # float32 defaults
                "nan": [int(np.isnan(x).sum()), int(np.isnan(y).sum())]}
        else:
            out[ta["name"]] = {"mismatches": int((x != y).sum())}
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_now() - c0, "bytes": 0, "tensors": len(out)}


ROUTES = {"read": route_read, "read1": route_read1, "compare": route_compare, "compare_open": route_compare_open,
          "naive": route_naive, "limit": route_limit, "verify": route_verify, "sha256": route_sha256,
          "numpy": route_numpy,
          "kernel": route_kernel, "kernel_generic": route_kernel_generic,
          "kernel_nohist": route_kernel_nohist, "kernel_fullhist": route_kernel_fullhist}


def child(route: str, a: str, b: str, out: str) -> None:
    import tensordiff.judge.walk

    if route == "naive":
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
    if route == "numpy":
        import safetensors.numpy  # noqa: F401
    import h5py  # noqa: F401  the HDF5 dumps' reader, for every route alike
    before = _rss_mb()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    res = ROUTES[route](Path(a), Path(b))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    # CPU seconds over the route's timed span where it measures them (as its wall time), else the whole route
    res.setdefault("cpu_s", (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime))
    res.update(rss_after_import_mb=before, peak_rss_mb=_rss_mb())
    Path(out).write_text(json.dumps(res))


# ----------------------------------------------------------------------------- driver

def _env() -> dict:
    """The children's environment: this checkout on the path, and Python's bytecode cached as for
    an installed tensordiff (in the tensordiff cache, as bench/command_time.py does). A shell with
    PYTHONDONTWRITEBYTECODE=1 (this project's sandbox) otherwise compiles every module a route
    imports lazily inside its timed span, each run: ~2 ms a module, a sixth of opening 100 small
    HDF5 tensors."""
    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tensordiff.cache import cache_root

    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": str(cache_root() / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(root: Path, route: str, cold: bool, env: dict | None = None) -> dict:
    (drop_cache if cold else warm)(root)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        subprocess.run([sys.executable, __file__, "--child", route, str(root / "a"), str(root / "b"), out],
                       check=True, env={**_env(), **(env or {})})
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
        if route == "verify":
            res[route]["verdict"] = first["verdict"]
        if route == "sha256":
            res[route]["tensors"] = first["tensors"]
        if route in ("limit", "kernel", "kernel_generic", "kernel_nohist", "kernel_fullhist"):
            res[route]["max_abs"] = first["max_abs"]
        if route.startswith("kernel"):
            res[route]["path"] = first["path"]
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
    if "limit" in res and "compare" in res:
        res["ratio_compare_to_limit"] = res["compare"]["wall_s"] / res["limit"]["wall_s"]
        pairs = [c["wall_s"] / r["wall_s"] for r, c in zip(runs["limit"], runs["compare"])]
        res["ratio_compare_to_limit_run_by_run"] = {"min": min(pairs), "median": statistics.median(pairs)}
    for route in ("kernel", "kernel_generic", "kernel_nohist", "kernel_fullhist"):
        if route in res and "limit" in res:  # the kernel alone over reading, wall and CPU seconds
            res[f"ratio_{route}_to_limit"] = res[route]["wall_s"] / res["limit"]["wall_s"]
            res[f"cpu_ratio_{route}_to_limit"] = res[route]["cpu_s"] / max(res["limit"]["cpu_s"], 1e-9)
    if "kernel" in res and "kernel_nohist" in res:  # the ULP histogram's share of the kernel
        res["ratio_kernel_to_kernel_nohist"] = res["kernel"]["wall_s"] / res["kernel_nohist"]["wall_s"]
        res["cpu_ratio_kernel_to_kernel_nohist"] = res["kernel"]["cpu_s"] / max(res["kernel_nohist"]["cpu_s"], 1e-9)
    if "kernel" in res and "kernel_fullhist" in res:  # what counting by cuts saves over the full histogram
        res["ratio_kernel_fullhist_to_kernel"] = res["kernel_fullhist"]["wall_s"] / res["kernel"]["wall_s"]
        res["cpu_ratio_kernel_fullhist_to_kernel"] = res["kernel_fullhist"]["cpu_s"] / max(res["kernel"]["cpu_s"], 1e-9)
    if "verify" in res and "compare" in res:
        res["ratio_verify_to_compare"] = res["verify"]["wall_s"] / res["compare"]["wall_s"]
        res["cpu_ratio_verify_to_compare"] = res["verify"]["cpu_s"] / max(res["compare"]["cpu_s"], 1e-9)
    if "verify" in res and "sha256" in res:  # verify over its own floor: hashing every byte alone
        res["ratio_verify_to_sha256"] = res["verify"]["wall_s"] / res["sha256"]["wall_s"]
        res["ratio_sha256_to_compare"] = res["sha256"]["wall_s"] / res["compare"]["wall_s"] if "compare" in res else None
    if "limit" in res and "compare" in res:  # CPU seconds: the steadier figure on a loaded machine
        res["cpu_ratio_compare_to_limit"] = res["compare"]["cpu_s"] / max(res["limit"]["cpu_s"], 1e-9)
    return res


def _kernel_status() -> str:
    """Which float path the children use (asked in a child, like the measurements)."""
    code = "from tensordiff.judge import native; native.float_kernel(); print(native.status)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env()).stdout.strip()


def table(name: str, s: dict) -> str:
    lines = [f"{name}:", f"  {'route':14} {'wall s':>8} {'median':>8} {'GB/s':>7} {'CPU s':>7} {'peak RSS MB':>12} {'(imports)':>10}"]
    for route in ROUTES:
        if route in s and isinstance(s[route], dict) and "gb_per_s" in s[route]:
            r = s[route]
            lines.append(f"  {route:14} {r['wall_s']:8.3f} {r['wall_s_median']:8.3f} {r['gb_per_s']:7.2f} {r['cpu_s']:7.2f} "
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
    if "ratio_compare_to_limit" in s:
        ok = s["ratio_compare_to_limit"] <= TARGET_RATIO
        rr = s["ratio_compare_to_limit_run_by_run"]
        lines.append(f"  compare / limit (C max|a-b|, 2 threads) = {s['ratio_compare_to_limit']:.2f}x best / best, "
                     f"run by run min {rr['min']:.2f}x median {rr['median']:.2f}x "
                     f"(target <= {TARGET_RATIO}x: {'met' if ok else 'NOT met'})")
    for route in ("kernel", "kernel_generic", "kernel_nohist", "kernel_fullhist"):
        if f"ratio_{route}_to_limit" in s:
            lines.append(f"  {route} alone / limit = {s[f'ratio_{route}_to_limit']:.2f}x wall, "
                         f"{s[f'cpu_ratio_{route}_to_limit']:.2f}x CPU seconds")
    if "ratio_kernel_to_kernel_nohist" in s:
        lines.append(f"  kernel / kernel without its ULP histogram = {s['ratio_kernel_to_kernel_nohist']:.2f}x wall, "
                     f"{s['cpu_ratio_kernel_to_kernel_nohist']:.2f}x CPU seconds (what the percentiles' bins cost)")
    if "ratio_kernel_fullhist_to_kernel" in s:
        lines.append(f"  kernel with every chunk in the full histogram / kernel = {s['ratio_kernel_fullhist_to_kernel']:.2f}x "
                     f"wall, {s['cpu_ratio_kernel_fullhist_to_kernel']:.2f}x CPU seconds (what the cuts save)")
    if "ratio_verify_to_compare" in s:
        ok = s["ratio_verify_to_compare"] <= TARGET_VERIFY
        lines.append(f"  verify / compare = {s['ratio_verify_to_compare']:.2f}x (target <= {TARGET_VERIFY}x: "
                     f"{'met' if ok else 'NOT met'})")
    if "ratio_verify_to_sha256" in s:
        below = s.get("ratio_sha256_to_compare")
        lines.append(f"  verify / sha256 alone (2 threads) = {s['ratio_verify_to_sha256']:.2f}x"
                     + (f"; hashing alone is {below:.2f}x compare, the least verify / compare can be" if below else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the other cases

def _spec_ok(root: Path, spec: dict) -> bool:
    sf = root / SPEC_FILE
    return sf.is_file() and json.loads(sf.read_text()) == spec and all(
        (root / s / "manifest.json").is_file() for s in ("a", "b"))


def generate_many(root: Path, n: int, fmt: str) -> None:
    """N small fp32 tensors per side, 40 "layers" (one file each) x N/40 steps; B = A + ~1 ULP."""
    from tensordiff import Recorder

    spec = {"many": n, "fmt": fmt, "shape": list(MANY_SHAPE), "version": 1}
    if _spec_ok(root, spec):
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = np.random.default_rng(7)
    base = rng.standard_normal((1024, *MANY_SHAPE), dtype=np.float32)
    for side in ("a", "b"):
        with Recorder(root / side, model="bench-many", fmt=fmt, producer={"name": "bench", "side": side}) as rec:
            for i in range(n):
                x = base[i % 1024] * np.float32(1 + i / n)
                rec.record(f"layer{i % 40}.step{i // 40}", x if side == "a" else x * np.float32(1 + 2 ** -22))
    (root / SPEC_FILE).write_text(json.dumps(spec))


def case_many(base: Path, counts: tuple[int, ...], repeat: int) -> dict:
    out: dict = {}
    for fmt in ("safetensors", "hdf5"):
        for n in counts:
            root = base / f"many-{fmt}-{n}"
            generate_many(root, n, fmt)
            s = series(root, ["compare", "numpy", "compare_open"],
                       {"compare": repeat, "numpy": repeat, "compare_open": repeat}, cold=False)
            c, m, o = s["compare"]["wall_s"], s["numpy"]["wall_s"], s["compare_open"]["wall_s"]
            out[f"{fmt}-{n}"] = {"tensors": n, "compare_s": c, "numpy_s": m, "ratio_compare_to_numpy": c / m,
                                 "compare_cpu_s": s["compare"]["cpu_s"], "numpy_cpu_s": s["numpy"]["cpu_s"],
                                 "cpu_ratio_compare_to_numpy": s["compare"]["cpu_s"] / max(s["numpy"]["cpu_s"], 1e-9),
                                 "ms_per_tensor": 1e3 * c / n, "compare_all": s["compare"]["wall_s_all"],
                                 "numpy_all": s["numpy"]["wall_s_all"],
                                 # opening the dumps included (what the CLI pays beside imports and report)
                                 "open_compare_s": o, "open_compare_cpu_s": s["compare_open"]["cpu_s"],
                                 "ratio_open_compare_to_numpy": o / m, "load_1m": s["loadavg_1m_after"]}
            shutil.rmtree(root, ignore_errors=True)
    for n in counts:
        out[f"hdf5_over_safetensors-{n}"] = out[f"hdf5-{n}"]["compare_s"] / out[f"safetensors-{n}"]["compare_s"]
        out[f"hdf5_over_safetensors_open-{n}"] = (out[f"hdf5-{n}"]["open_compare_s"]
                                                  / out[f"safetensors-{n}"]["open_compare_s"])
    return out


def generate_memory(root: Path, numel: int) -> None:
    """One fp32 tensor of `numel` elements per side, written in chunks (never whole in memory)."""
    spec = {"memory": numel, "version": 1}
    if _spec_ok(root, spec):
        return
    shutil.rmtree(root, ignore_errors=True)
    import struct

    nbytes = numel * 4
    hb = json.dumps({"__metadata__": {"format": "tensordiff-dump"},
                     "big": {"dtype": "F32", "shape": [numel // 1000, 1000] if numel % 1000 == 0 else [numel],
                             "data_offsets": [0, nbytes]}}, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    step = 1 << 24
    for side in ("a", "b"):
        (root / side).mkdir(parents=True)
        with open(root / side / "big.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for s in range(0, numel, step):
                x = np.random.default_rng(s).standard_normal(min(step, numel - s), dtype=np.float32)
                if side == "b":
                    x *= np.float32(1 + 2 ** -22)
                f.write(x.data)
        shape = json.loads(hb)["big"]["shape"]
        (root / side / "manifest.json").write_text(json.dumps({
            "format": "tensordiff-dump", "version": 1, "model": "bench-memory", "producer": {"name": "bench"},
            "run": {}, "tensors": [{"name": "big", "file": "big.safetensors", "shape": shape, "dtype": "float32"}]}))
    (root / SPEC_FILE).write_text(json.dumps(spec))


def case_memory(base: Path, numel: int) -> dict:
    root = base / "memory"
    generate_memory(root, numel)
    out: dict = {"numel": numel, "bytes_per_side": numel * 4}
    try:
        for w in (1, 2):
            r = measure(root, "compare", False, env={"TENSORDIFF_THREADS": str(w)})
            out[f"threads_{w}"] = {"peak_rss_mb": r["peak_rss_mb"], "rss_after_import_mb": r["rss_after_import_mb"],
                                   "wall_s": r["wall_s"]}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["peak_rss_mb_max"] = max(out[f"threads_{w}"]["peak_rss_mb"] for w in (1, 2))
    return out


def case_cli(repeat: int) -> dict:
    """`tensordiff compare` on the sample dumps as a user runs it (interpreter start included),
    beside `python -c "import numpy"` (its floor: the comparator is numpy only)."""
    tree = Path(__file__).resolve().parents[1]
    cmds = {"compare": [sys.executable, "-m", "tensordiff.commands.cli", "compare", str(tree / "dumps/sample-oracle"),
                        str(tree / "dumps/sample-engine")],
            "python_numpy": [sys.executable, "-c", "import numpy"]}
    out: dict = {}
    for name, cmd in cmds.items():
        walls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, env=_env(), cwd=tree)
            walls.append(time.perf_counter() - t0)
            if r.returncode not in (0, 1):
                raise RuntimeError(f"{cmd} failed: {r.stderr.decode()[-500:]}")
        out[name] = {"wall_s": min(walls), "wall_s_median": statistics.median(walls)}
    out["compare_minus_numpy_s"] = out["compare"]["wall_s"] - out["python_numpy"]["wall_s"]
    return out


def _build_limit(where: Path) -> Path:
    so = where / "limit_maxabs.so"
    src = Path(__file__).with_name("limit_maxabs.c")
    subprocess.run([os.environ.get("CC") or "cc", "-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC",
                    "-o", str(so), str(src)], check=True)
    return so


def summary(report: dict) -> list[tuple[str, str, float, str]]:
    """(target, figure, value, met) rows for the table at the end."""
    rows = []
    w = report.get("warm", {})
    if "ratio_compare_to_limit" in w:
        rows.append(("big: compare / C limit", f"<= {TARGET_RATIO}", w["ratio_compare_to_limit"],
                     w["ratio_compare_to_limit"] <= TARGET_RATIO))
    if "cpu_ratio_compare_to_limit" in w:
        rows.append(("big: compare / C limit, CPU seconds", f"<= {TARGET_RATIO}", w["cpu_ratio_compare_to_limit"],
                     w["cpu_ratio_compare_to_limit"] <= TARGET_RATIO))
    for route in ("kernel", "kernel_generic", "kernel_nohist", "kernel_fullhist"):  # sub-measurements: no target of their own
        if f"ratio_{route}_to_limit" in w:
            rows.append((f"big: {route} alone / C limit", "-", w[f"ratio_{route}_to_limit"], None))
            rows.append((f"big: {route} alone / C limit, CPU seconds", "-", w[f"cpu_ratio_{route}_to_limit"], None))
    if "ratio_verify_to_compare" in w:
        rows.append(("big: verify / compare", f"<= {TARGET_VERIFY}", w["ratio_verify_to_compare"],
                     w["ratio_verify_to_compare"] <= TARGET_VERIFY))
        rows.append(("big: verify / compare, CPU seconds", f"<= {TARGET_VERIFY}", w["cpu_ratio_verify_to_compare"],
                     w["cpu_ratio_verify_to_compare"] <= TARGET_VERIFY))
    if "ratio_verify_to_sha256" in w:  # sub-measurements: verify's own floor, no target of its own
        rows.append(("big: verify / sha256 alone", "-", w["ratio_verify_to_sha256"], None))
        if w.get("ratio_sha256_to_compare"):
            rows.append(("big: sha256 alone / compare", "-", w["ratio_sha256_to_compare"], None))
    m = report.get("many", {})
    for k, v in m.items():
        if k.startswith(("safetensors-", "hdf5-")):
            rows.append((f"many {k}: compare / numpy script", "< 1", v["ratio_compare_to_numpy"],
                         v["ratio_compare_to_numpy"] < 1))
            if v["tensors"] == 20_000:
                rows.append((f"many {k}: compare s", f"<= {TARGET_MANY_S}", v["compare_s"],
                             v["compare_s"] <= TARGET_MANY_S))
        elif k.startswith("hdf5_over"):
            rows.append((f"many {k}", f"<= {TARGET_HDF5}", v, v <= TARGET_HDF5))
    if "memory" in report:
        v = report["memory"]["peak_rss_mb_max"]
        rows.append(("memory: peak RSS MB, 1.6 GB/side, 1 and 2 threads", f"<= {TARGET_MEMORY_MB}", v,
                     v <= TARGET_MEMORY_MB))
    if "cli" in report:
        v = report["cli"]["compare"]["wall_s"]
        rows.append(("cli: tensordiff compare sample dumps, s", f"<= {TARGET_CLI_S}", v, v <= TARGET_CLI_S))
    return [(a, b, c, "-" if d is None else ("met" if d else "NOT met")) for a, b, c, d in rows]


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
    ap.add_argument("--size-mb", type=float, default=2200, help="big case: total size of both dumps (default 2200)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per route; the best wall time is reported")
    ap.add_argument("--naive-repeat", type=int, default=1)
    ap.add_argument("--routes", default="limit,kernel,kernel_nohist,kernel_fullhist,read,compare,verify,sha256,read1,naive",
                    help="big case routes")
    ap.add_argument("--cases", default="big,many,memory,cli", help="which cases (default all)")
    ap.add_argument("--many-counts", default=",".join(map(str, MANY_COUNTS)))
    ap.add_argument("--memory-numel", type=int, default=MEMORY_NUMEL)
    ap.add_argument("--cold", action="store_true", help="also measure with the files dropped from the page cache")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)

    routes = [r for r in args.routes.split(",") if r]
    if unknown := [r for r in routes if r not in ROUTES]:
        ap.error(f"unknown route(s) {unknown}")
    cases = [c for c in args.cases.split(",") if c]
    if unknown := [c for c in cases if c not in ("big", "many", "memory", "cli")]:
        ap.error(f"unknown case(s) {unknown}")
    tmp = None
    root = args.dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="tensordiff-bench-")
        root = Path(tmp)
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.environ[LIMIT_SO_ENV] = str(_build_limit(root))
        from tensordiff.judge import stream

        report: dict = {
            "benchmark": "compare_throughput",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                        "platform": platform.platform()},
            "comparator": {"chunk_elements": stream.CHUNK, "workers": stream.WORKERS, "kernel": _kernel_status()},
            "targets": {"ratio_max": TARGET_RATIO, "peak_rss_mb_max": TARGET_RSS_MB, "verify": TARGET_VERIFY,
                        "many_s": TARGET_MANY_S, "hdf5": TARGET_HDF5, "memory_mb": TARGET_MEMORY_MB,
                        "cli_s": TARGET_CLI_S},
        }
        print(f"{os.cpu_count()} CPUs, chunk {stream.CHUNK} elements, {stream.WORKERS} workers, "
              f"float kernel: {report['comparator']['kernel']}; best of {args.repeat} runs (a shared machine is noisy)")
        if "big" in cases:
            t0 = time.perf_counter()
            # in a child: the driver stays small, so its RSS cannot leak into the measured children
            spec = json.loads(subprocess.run([sys.executable, __file__, "--generate", str(root), str(args.size_mb)],
                                             check=True, capture_output=True, text=True, env=_env()).stdout)
            report["dumps"] = {"dir": str(root), "n_patches": spec["n"], "generate_s": time.perf_counter() - t0,
                               "bytes": sum(p.stat().st_size for p in _files(root))}
            if "kernel_nohist" in routes and "AVX-512" not in report["comparator"]["kernel"]:
                routes = [r for r in routes if r != "kernel_nohist"]  # its switch is the AVX-512 path's
                print("kernel_nohist skipped: the kernel has no AVX-512 path here")
            repeat = {r: (args.naive_repeat if r == "naive" else args.repeat) for r in routes}
            report["warm"] = series(root, routes, repeat, cold=False)
            if args.cold:
                report["cold"] = series(root, routes, repeat, cold=True)
            w = report["warm"]
            ratio = w.get("ratio_compare_to_limit", w.get("ratio_compare_to_read", float("inf")))
            report["met"] = {"ratio": ratio <= TARGET_RATIO,
                             "rss": w.get("compare", {}).get("peak_rss_mb", float("inf")) < TARGET_RSS_MB}
            print(f"big: dumps {report['dumps']['bytes'] / 1e6:.0f} MB in {root} (N = {spec['n']} patches)")
            print(f"load average (1 min) when done: {w['loadavg_1m_after']:.1f} (other work on the machine slows wall times)")
            print(table("page cache warm (every route after a full read of the files)", w))
            if args.cold:
                print(table("page cache dropped (posix_fadvise DONTNEED, best effort)", report["cold"]))
            if tmp:  # no --dir: the big dumps go at once (2.2 GB of a shared disk)
                for side in ("a", "b"):
                    shutil.rmtree(root / side, ignore_errors=True)
        if "many" in cases:
            counts = tuple(int(x) for x in args.many_counts.split(",") if x)
            report["many"] = m = case_many(root, counts, args.repeat)
            print("many small tensors [25, 128] fp32 (compare vs a minimal numpy script, best wall s):")
            for k, v in m.items():
                if isinstance(v, dict):
                    print(f"  {k:18} compare {v['compare_s']:7.3f} s ({v['ms_per_tensor']:.3f} ms/tensor, "
                          f"CPU {v['compare_cpu_s']:.3f} s)  numpy {v['numpy_s']:7.3f} s (CPU {v['numpy_cpu_s']:.3f} s)  "
                          f"ratio {v['ratio_compare_to_numpy']:.2f}x (CPU {v['cpu_ratio_compare_to_numpy']:.2f}x); "
                          f"opening included {v['open_compare_s']:.3f} s ({v['ratio_open_compare_to_numpy']:.2f}x); "
                          f"load {v['load_1m']:.1f}")
                else:
                    print(f"  {k:28} {v:.2f}x")
        if "memory" in cases:
            report["memory"] = m = case_memory(root, args.memory_numel)
            print(f"memory: one {m['bytes_per_side'] / 1e9:.2f} GB-per-side fp32 tensor: peak RSS "
                  + ", ".join(f"{w} thread(s) {m[f'threads_{w}']['peak_rss_mb']:.0f} MB "
                              f"(imports {m[f'threads_{w}']['rss_after_import_mb']:.0f} MB, "
                              f"{m[f'threads_{w}']['wall_s']:.2f} s)" for w in (1, 2)))
        if "cli" in cases:
            report["cli"] = c = case_cli(max(args.repeat, 5))
            print(f"cli: tensordiff compare on the sample dumps {c['compare']['wall_s']:.3f} s best "
                  f"({c['compare']['wall_s_median']:.3f} median); python -c 'import numpy' "
                  f"{c['python_numpy']['wall_s']:.3f} s")
        report["summary"] = rows = summary(report)
        print("summary (target, figure, value):")
        for name, target, value, met in rows:
            print(f"  {name:55} {target:>8} {value:9.3f}  {met}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
