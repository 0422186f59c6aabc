"""The fuzz targets run long, by hand (CI runs them for seconds through tests/fuzz/test_fuzz.py).

    python tests/fuzz/run_long.py [--n 100000] [--target NAME ...] [--seed 0] [--save]

Mutates each target's seeds `--n` times (tests/fuzz/targets.py), counts the inputs seen and the
findings (any exception but BadInput, a multi-line message, a write by the reader), prints one
line per target and, with --save, writes each distinct finding's input to
tests/fuzz/crashes/<target>/<sha>.crash (raw bytes, named so that no loader takes them for a pickle shard; the regression cases test_fuzz.py replays).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import CRASHES, SEEDS, check, mutate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--target", action="append", choices=sorted(SEEDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", action="store_true")
    a = ap.parse_args()
    total_findings = 0
    for target in a.target or sorted(SEEDS):
        rng = np.random.default_rng(a.seed)
        seeds = SEEDS[target]
        kinds: dict[str, bytes] = {}
        t0 = time.time()
        with tempfile.TemporaryDirectory() as w:
            work = Path(w)
            for i in range(a.n):
                data = mutate(seeds[i % len(seeds)], rng)
                if rng.integers(0, 4) == 0:  # mutations of mutations reach further
                    data = mutate(data, rng)
                found = check(target, data, work / "w")
                if found:
                    sig = found.strip().splitlines()[-1][:200]
                    if sig not in kinds:
                        kinds[sig] = data
                        print(f"  {target}: finding {sig}", flush=True)
        total_findings += len(kinds)
        print(f"{target}: {a.n} inputs, {len(kinds)} distinct finding(s), {time.time() - t0:.0f} s", flush=True)
        if a.save:
            for data in kinds.values():
                d = CRASHES / target
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{hashlib.sha256(data).hexdigest()[:16]}.crash").write_bytes(data)
    return 1 if total_findings else 0


if __name__ == "__main__":
    sys.exit(main())
