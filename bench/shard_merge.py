"""Benchmark: comparing a sharded run (rank dumps, merged while streaming) against a whole dump,
with the peak resident memory of the comparing process.

    python bench/shard_merge.py                                   # 2 GB of rank dumps in a temp dir
    python bench/shard_merge.py --dir /tmp/shardbench --size-mb 2048 --ranks 4 --json shard.json

Writes a reference dump (whole tensors) and a W-rank run (`DIR/run/rank<r>`) holding the same
tensors in every layout the format has: a hidden-size split (`shard` on axis 1: each chunk of
rows gathers a slice of every row from every rank), a token split (axis 0, bf16), a partial sum
(every rank a quarter of the whole, exact in fp32) and replicated integer ids. `--size-mb` is the
rank dumps' total. Each route runs in its own subprocess so `ru_maxrss` is its own peak:

- read:    the merged tensors streamed in the comparator's chunks, no metrics (what merging costs)
- compare: `tensordiff.compare_dumps(reference, run)`: merge, judge, the replica digests
Target: the compare's peak RSS under 1 GB whatever the size. Wall and CPU seconds are reported,
and compare / read as a ratio; no time is a target.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TARGET_RSS_MB = 1024
HIDDEN, TOKW, PART, IDS = 4096, 1024, 1024, 8
ROWS_PER_BLOCK = 2048


def bytes_per_row(world: int) -> int:
    """Rank-dump bytes per token row: h fp32 split, t bf16 split, p fp32 on every rank, ids on every rank."""
    return HIDDEN * 4 + TOKW * 2 + world * PART * 4 + world * IDS * 8


class Writer:
    """One safetensors file of one tensor, written block by block (the whole never in memory)."""

    def __init__(self, path: Path, key: str, st: str, shape: tuple[int, ...], itemsize: int):
        n = int(np.prod(shape)) * itemsize
        header = json.dumps({key: {"dtype": st, "shape": list(shape), "data_offsets": [0, n]}}).encode()
        header += b" " * (-len(header) % 8)
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(header)) + header)

    def write(self, a: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(a).tobytes())

    def close(self) -> None:
        self.f.close()


def bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def manifest(path: Path, entries: list[dict], run: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"format": "tensordiff-dump", "version": 1, "model": "shard-bench",
                                                    "producer": {"name": "bench"}, "run": run, "tensors": entries}))


def write(root: Path, n: int, world: int) -> None:
    ref, run = root / "ref", root / "run"
    specs = {  # name -> (safetensors dtype, itemsize, whole shape, layout, rank shape)
        "h": ("F32", 4, (n, HIDDEN), {"dims": "tokens hidden[tp]"}, (n, HIDDEN // world)),
        "t": ("BF16", 2, (n, TOKW), {"shard": "axis0"}, None),
        "p": ("F32", 4, (n, PART), {"partial": "sum"}, (n, PART)),
        "ids": ("I64", 8, (n, IDS), {"replicated": True}, (n, IDS)),
    }
    rows = np.array_split(np.arange(n), world)
    for d in [ref] + [run / f"rank{r}" for r in range(world)]:
        d.mkdir(parents=True)
    wr, wk = {}, {}
    for name, (st, size, shape, lay, rshape) in specs.items():
        wr[name] = Writer(ref / f"{name}.safetensors", name, st, shape, size)
        for r in range(world):
            rs = (len(rows[r]), shape[1]) if name == "t" else rshape
            wk[name, r] = Writer(run / f"rank{r}" / f"{name}.safetensors", name, st, rs, size)
    dtypes = {"h": "float32", "t": "bfloat16", "p": "float32", "ids": "int64"}
    for s in range(0, n, ROWS_PER_BLOCK):
        e = min(n, s + ROWS_PER_BLOCK)
        g = np.random.default_rng(s)
        h = g.standard_normal((e - s, HIDDEN), dtype=np.float32)
        t = bf16(g.standard_normal((e - s, TOKW), dtype=np.float32))
        p = g.standard_normal((e - s, PART), dtype=np.float32)
        ids = g.integers(0, 384, (e - s, IDS), dtype=np.int64)
        for name, a in (("h", h), ("t", t), ("p", p), ("ids", ids)):
            wr[name].write(a)
        for r in range(world):
            wk["h", r].write(np.array_split(h, world, axis=1)[r])
            lo, hi = rows[r][0], rows[r][-1] + 1  # this block's rows that rank r holds
            if min(e, hi) > max(s, lo):
                wk["t", r].write(t[max(s, lo) - s:min(e, hi) - s])
            wk["p", r].write(p * np.float32(1 / world) if world in (1, 2, 4, 8) else p / world)
            wk["ids", r].write(ids)
    for w in list(wr.values()) + list(wk.values()):
        w.close()
    manifest(ref, [{"name": k, "file": f"{k}.safetensors", "dtype": dtypes[k]} for k in specs], {})
    for r in range(world):
        ents = []
        for k, (_, _, _, lay, _) in specs.items():
            lay = {"shard": {"axis": 0, "index": r, "count": world}} if k == "t" else lay
            ents.append({"name": k, "file": f"{k}.safetensors", "dtype": dtypes[k], **lay})
        manifest(run / f"rank{r}", ents, {"parallel": {"rank": r, "world": world}})


def child(route: str, root: Path) -> None:
    """One route in this process; prints its JSON line."""
    sys.path.insert(0, str(ROOT))
    from tensordiff.judge import stream
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.format.dump import open_dump

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c0, t0 = time.process_time(), time.perf_counter()
    out: dict = {"route": route}
    if route == "read":
        d = open_dump(root / "run")
        total = 0
        for e in d.entries:
            row = int(np.prod(e.shape[1:])) if len(e.shape) > 1 else 0
            step = stream.chunk_len(row)
            r = e.stored.reader()
            try:
                for s in range(0, e.stored.numel, step):
                    x = r.read(s, min(e.stored.numel, s + step))
                    total += x.nbytes
                    stream.release(r, s, min(e.stored.numel, s + step))
            finally:
                r.close()
        out["logical_bytes"] = total
    else:
        rep = compare_dumps(root / "ref", root / "run")
        out["verdict"] = rep.verdict
        out["statuses"] = {b.name: b.status for b in rep.boundaries}
    out.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rss_after_import_mb=rss0)
    print(json.dumps(out))


def measure(route: str, root: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", route, "--dir", str(root)], capture_output=True,
                       text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{route} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--size-mb", type=float, default=2048, help="total bytes of the rank dumps")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.dir)
        return
    tmp = a.dir is None
    root = Path(tempfile.mkdtemp(prefix="shard-bench-")) if tmp else a.dir
    try:
        if (root / "run").exists() or (root / "ref").exists():
            raise SystemExit(f"{root} already holds a benchmark's dumps; give an empty --dir")
        n = max(a.ranks, int(a.size_mb * 1e6 // bytes_per_row(a.ranks)))
        t0 = time.perf_counter()
        write(root, n, a.ranks)
        written = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in (root / "run").rglob("*.safetensors"))
        for f in root.rglob("*.safetensors"):  # page-cache warm, as the throughput benchmark starts
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
        read, comp = measure("read", root), measure("compare", root)
        rep = {"ranks": a.ranks, "rows": n, "rank_dump_bytes": size, "write_s": written, "read": read,
               "compare": comp, "ratio_compare_to_read": comp["wall_s"] / max(read["wall_s"], 1e-9),
               "target_rss_mb": TARGET_RSS_MB, "met": {"rss": comp["peak_rss_mb"] < TARGET_RSS_MB},
               "cpu_count": os.cpu_count()}
        print(f"rank dumps: {size / 1e9:.2f} GB over {a.ranks} ranks ({n} rows)")
        print(f"read (merge only): {read['wall_s']:.2f} s wall, {read['cpu_s']:.2f} s CPU, peak RSS {read['peak_rss_mb']:.0f} MB")
        print(f"compare:           {comp['wall_s']:.2f} s wall, {comp['cpu_s']:.2f} s CPU, peak RSS "
              f"{comp['peak_rss_mb']:.0f} MB (target < {TARGET_RSS_MB}), verdict {comp['verdict']}")
        print(f"compare / read: {rep['ratio_compare_to_read']:.2f}")
        if a.json:
            a.json.write_text(json.dumps(rep, indent=1))
        if comp["verdict"] != "match":
            raise SystemExit("the merged run does not match its reference: the benchmark's dumps are wrong")
    finally:
        if tmp:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
