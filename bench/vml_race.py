"""How often a fresh process's first parallel VML call takes the low-accuracy kernel, with and
without tensordiff's warm-up (tensordiff/warmup.py), under a competing busy loop.

    python bench/vml_race.py OUT [--runs N] [--jobs J]

Runs N fresh `tests/tensordiff/vml_worker.py` processes with TENSORDIFF_VML_WARMUP=0 and N with
the warm-up, J at a time, while one `while True: pass` process competes for the cores; writes
OUT/vml_race.json (per mode: runs, runs with a defect, the defects) and prints a summary. A CPU
measurement (the race is in oneMKL's CPU dispatch); minutes for N = 40 on two cores.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "tensordiff" / "vml_worker.py"


def run_mode(warm: bool, runs: int, jobs: int) -> dict:
    env = dict(os.environ, TENSORDIFF_VML_WARMUP="1" if warm else "0", PYTHONPATH=str(ROOT))
    results, defects = [], []
    t0 = time.time()
    for start in range(0, runs, jobs):
        procs = [subprocess.Popen([sys.executable, str(WORKER)], env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(min(jobs, runs - start))]
        for p in procs:
            out, _ = p.communicate(timeout=300)
            r = json.loads(out.strip().splitlines()[-1])
            results.append(r)
            if r["defects"]:
                defects.append(r["defects"])
    return {"warm_up": warm, "runs": len(results), "runs_with_defect": len(defects), "defects": defects,
            "seconds": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still stops the busy loop
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    modes = []
    try:
        for warm in (False, True):  # results written after each mode: a cut-short run keeps what it measured
            modes.append(run_mode(warm, a.runs, a.jobs))
            (a.out / "vml_race.json").write_text(json.dumps({"cpus": os.cpu_count(), "modes": modes}, indent=1) + "\n")
    finally:
        load.kill()
        load.wait()
    for m in modes:
        print(f"warm-up {'on ' if m['warm_up'] else 'off'}: {m['runs_with_defect']}/{m['runs']} fresh processes "
              f"with a defect ({m['seconds']} s)")
        for d in m["defects"][:5]:
            print("   ", "; ".join(d))


if __name__ == "__main__":
    main()
