"""Benchmark: the test suite's time as a ratio to `python -c "import torch"`, measured in the same run.

    python bench/suite_time.py OUTDIR                     # the README's test command, whole suite
    python bench/suite_time.py OUTDIR -- tests/hip -q     # any pytest arguments after --

The baseline (a fresh interpreter importing torch, the fixed cost every CLI test pays) runs
--rounds times (5) before and as many after the suite, so load that changes during the run hits
both ends; the suite runs once, on a fresh TENSORDIFF_CACHE as on CI, with `bench/suite_cpu.py`
recording each test's wall and CPU seconds (its own process and the children it waited for, so
xdist workers and CLI subprocesses count).

The target is 6 minutes of wall on a quiet 2-core machine. The ratio is what carries from
machine to machine: where torch's import takes 1.5-1.9 s, 6 minutes is about 190-240 imports.
Writes OUTDIR/suite_time.json: the suite's wall and CPU seconds, the baseline's median
wall and CPU, both ratios, the pytest summary line and its exit status, the collection's cost
and the 40 slowest tests by CPU. Exit status: pytest's (no time is asserted; a slow shared
machine is not an error), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict, **kw) -> tuple[float, float, subprocess.CompletedProcess]:
    c0, w0 = _children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=ROOT, **kw)
    return time.perf_counter() - w0, _children_cpu() - c0, p


def baseline(env: dict, rounds: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(rounds):
        w, c, p = timed([sys.executable, "-c", "import torch"], env, capture_output=True)
        if p.returncode:
            raise SystemExit(f"suite_time: `import torch` failed: {p.stderr.decode()[-300:]}")
        out.append((w, c))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--rounds", type=int, default=5, help="baseline runs before and after the suite (each)")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # pytest's own arguments follow --
    a = ap.parse_args(argv[:cut])
    a.pytest_args = argv[cut + 1:]
    if a.outdir.exists() and not a.outdir.is_dir():
        print(f"suite_time: {a.outdir} is not a directory", file=sys.stderr)
        return 2
    if a.rounds < 1:
        print(f"suite_time: --rounds must be at least 1, not {a.rounds}", file=sys.stderr)
        return 2
    if (a.outdir / "suite_time.json").exists():
        print(f"suite_time: {a.outdir / 'suite_time.json'} already exists; refusing to overwrite it", file=sys.stderr)
        return 2
    a.outdir.mkdir(parents=True, exist_ok=True)
    args = a.pytest_args or ["-q"]

    # the run is a pytest session of its own: a caller's xdist worker identity (this bench run by a
    # test under xdist) would make its controller write as that worker, over its workers' records
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cache = tempfile.mkdtemp(prefix="suite-time-cache-")  # a clean cache, as on CI
    env["TENSORDIFF_CACHE"] = cache
    cpu_out = Path(tempfile.mkdtemp(prefix="suite-time-cpu-")) / "cpu.json"

    before = baseline(env, a.rounds)
    cmd = [sys.executable, "-m", "pytest", *args, "-p", "bench.suite_cpu", f"--suite-cpu-out={cpu_out}"]
    wall, cpu, p = timed(cmd, env, capture_output=True, text=True)
    after = baseline(env, a.rounds)

    tests, collect = {}, None
    for f in sorted(glob.glob(str(cpu_out.with_name("cpu*.json")))):
        rec = json.loads(Path(f).read_text())
        tests.update(rec["tests"])
        collect = collect or rec["collect"]
    base_w = statistics.median(w for w, _ in before + after)
    base_c = statistics.median(c for _, c in before + after)
    summary = next((ln for ln in reversed(p.stdout.splitlines()) if " in " in ln and ("passed" in ln or "failed" in ln)), "")
    rep = {
        "command": shlex.join(["python", "-m", "pytest", *args]),
        "exit_status": p.returncode,
        "summary": summary.strip("= "),
        "suite_wall_s": round(wall, 2), "suite_cpu_s": round(cpu, 2),
        "import_torch_wall_s": round(base_w, 3), "import_torch_cpu_s": round(base_c, 3),
        "import_torch_walls_s": [round(w, 3) for w, _ in before + after],
        "ratio_wall": round(wall / base_w, 1), "ratio_cpu": round(cpu / base_c, 1),
        "target": "suite <= 6 min wall on a quiet 2-core machine",
        "load_average_after": os.getloadavg(),
        "cores": os.cpu_count(),
        "collect": collect,
        "tests_recorded": len(tests),
        "slowest_by_cpu": dict(sorted(tests.items(), key=lambda kv: -kv[1]["cpu_s"])[:40]),
    }
    (a.outdir / "suite_time.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(f"suite: {wall:.1f} s wall, {cpu:.1f} s CPU; import torch {base_w:.2f} s wall, {base_c:.2f} s CPU; "
          f"ratio {rep['ratio_wall']}x wall, {rep['ratio_cpu']}x CPU ({rep['summary']})")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
