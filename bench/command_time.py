"""Benchmark: the commands' wall time against importing torch, measured in the same run.

    python bench/command_time.py OUTDIR                 # 5 rounds of every command (CPU, tiny configs)
    python bench/command_time.py OUTDIR --rounds 1 --only compare

Each command runs as its own fresh interpreter (`python -m tensordiff.commands.cli ...`), as a user or CI
starts it; the baseline `python -c "import torch"` runs interleaved with them, round by round, so
load on a shared machine hits both alike. Oracle dumps are cached (one untimed warm-up run of each
command fills a cache private to this run), so `check` and `gate` time the engine, the compare
and the imports, which is what runs on every commit.

Targets (on the tiny configs):
    check             <= torch import + 0.5 s
    gate (one image)  <= torch import + 0.8 s
    compare           <= 0.25 s (torch-free)
Also recorded per command, from one `-X importtime` run: whether transformers, scipy, sympy or
torch were imported at all (DeepSeek must not import transformers; scipy and sympy only where a
path uses them).

Bytecode: every child runs with Python's bytecode cache on (PYTHONDONTWRITEBYTECODE dropped), as
an installed or checked-out tensordiff runs for a user, in a folder of the tensordiff cache
(PYTHONPYCACHEPREFIX = `cache_root()/pycache`), torch's baseline included: the warm-up fills it,
so only a bench's first run compiles torch, and Python checks each file's stamp, so an edited
module is compiled again. A shell that sets PYTHONDONTWRITEBYTECODE=1 (as this project's sandbox
does) otherwise makes every command compile the ~120 tensordiff, engine and oracle modules it
imports from source, each run (0.15-0.2 s of CPU on the 2-core machine). `--as-is` keeps the
environment's setting; the JSON's `bytecode` says which ran.

Writes OUTDIR/command_time.json: per command the wall times of every round, their median and
minimum, the excess over the torch import's median (`over_torch_s`, from the medians;
`over_frozen_torch_s`, over torch imported as the commands import it, the collector paused and
frozen: their own work, without the collector's ~0.3 s in a plain import and its exit;
`over_torch_min_s`, from each one's fastest run; `over_torch_cpu_s`, from the child processes' CPU
seconds, the figure least disturbed by other load on a shared machine), the target and whether it
is met (judged on the medians). Exit status 0 (no timing is asserted anywhere: a slow shared machine
is not an error), 2 if a command fails.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tensordiff.cache import cache_root  # noqa: E402  (TENSORDIFF_CACHE, else the user's cache folder)

FROZEN = "import torch (collector paused, frozen)"
WATCHED = ("torch", "transformers", "scipy", "sympy", "rich", "h5py", "numpy")

ONE_IMAGE_GATE = """[gate]
name = "command_time one image"
images = ["tensordiff:default"]
cache = true
[[model]]
name = "{model}"
weights = "synthetic:tiny"
dtype = "float32"
device = "cpu"
"""

# name -> (cli arguments, target: ("torch+", seconds) or ("abs", seconds), the exit status it must give)
def commands(work: Path) -> dict[str, tuple[list[str], tuple[str, float], int]]:
    gates = {}
    for model in ("deepseek-v4.1-flash", "qwen3-vl"):
        p = work / f"gate-{model}.toml"
        p.write_text(ONE_IMAGE_GATE.format(model=model))
        gates[model] = str(p)
    samples = ROOT / "dumps"
    return {
        "check deepseek-v4.1-flash": (["check", "deepseek-v4.1-flash"], ("torch+", 0.5), 0),
        "check qwen3-vl": (["check", "qwen3-vl"], ("torch+", 0.5), 0),
        "gate deepseek-v4.1-flash (1 image)": (["gate", gates["deepseek-v4.1-flash"], "-q"], ("torch+", 0.8), 0),
        "gate qwen3-vl (1 image)": (["gate", gates["qwen3-vl"], "-q"], ("torch+", 0.8), 0),
        "compare samples": (["compare", str(samples / "sample-oracle"), str(samples / "sample-engine")],
                            ("abs", 0.25), 1),  # the sample engine dump diverges on purpose
    }


def _env(cache: Path, pycache: Path | None) -> dict:
    """The children's environment: this checkout first on the path, a private oracle cache, and
    (`pycache`) Python's bytecode cache in a folder of its own."""
    env = dict(os.environ, TENSORDIFF_CACHE=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def _wall(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess, float]:
    """(wall seconds, result, CPU seconds of the child: user + system, all its threads)."""
    c0, t0 = _children_cpu(), time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, r, _children_cpu() - c0


def _imported(argv: list[str], env: dict) -> dict[str, bool]:
    """Which of WATCHED a run imports (top-level package names in `-X importtime`'s report)."""
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
    seen = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            seen.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return {name: name in seen for name in WATCHED}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", action="append", default=[], help="run only commands whose name contains this")
    ap.add_argument("--as-is", action="store_true",
                    help="keep the environment's bytecode setting (PYTHONDONTWRITEBYTECODE) instead of a private cache")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="command-time-"))
    try:
        return _bench(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args, work: Path) -> int:
    env = _env(work / "cache", None if args.as_is else cache_root() / "pycache")
    py = sys.executable
    cmds = {k: v for k, v in commands(work).items() if not args.only or any(s in k for s in args.only)}
    baseline = [py, "-c", "import torch"]
    # torch imported as `check` and `gate` import it (tensordiff/commands/heap.py): the collector paused, then
    # frozen. The commands' excess over this one is their own work; over the plain import it also
    # counts the ~0.3 s the collector spends in a plain import of torch and at its exit.
    frozen = [py, "-c", "import gc; gc.disable(); import torch; gc.freeze(); gc.enable()"]
    if not args.as_is:  # the baseline's own bytecode, cached like the commands' (--as-is: the environment's)
        subprocess.run(baseline, env=env, check=True)

    for name, (cli, _, rc) in cmds.items():  # fills the oracle cache; any failure is a broken bench
        _, r, _ = _wall([py, "-m", "tensordiff.commands.cli", *cli], env)
        if r.returncode != rc:
            print(f"error: {name} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}", file=sys.stderr)
            return 2

    walls: dict[str, list[float]] = {"import torch": [], FROZEN: [], **{k: [] for k in cmds}}
    cpus: dict[str, list[float]] = {k: [] for k in walls}
    for _ in range(args.rounds):
        for name, argv in [("import torch", baseline), (FROZEN, frozen)] + [
                (n, [py, "-m", "tensordiff.commands.cli", *c]) for n, (c, _, _) in cmds.items()]:
            wall, _, cpu = _wall(argv, env)
            walls[name].append(wall)
            cpus[name].append(cpu)

    torch_med, torch_min = statistics.median(walls["import torch"]), min(walls["import torch"])
    torch_cpu = statistics.median(cpus["import torch"])
    res = {"python": sys.version.split()[0], "rounds": args.rounds, "cpus": os.cpu_count(),
           "load_average": list(os.getloadavg()),
           "bytecode": ("the environment's (PYTHONDONTWRITEBYTECODE="
                        f"{os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')})" if args.as_is
                        else f"cached in {cache_root() / 'pycache'} (PYTHONPYCACHEPREFIX)"),
           "import torch": {"walls_s": walls["import torch"], "median_s": torch_med, "min_s": torch_min,
                            "cpu_s": cpus["import torch"], "cpu_median_s": torch_cpu},
           FROZEN: {"walls_s": walls[FROZEN], "median_s": statistics.median(walls[FROZEN]),
                    "cpu_median_s": statistics.median(cpus[FROZEN])},
           "commands": {}}
    for name, (cli, (kind, limit), _) in cmds.items():
        w = walls[name]
        med, lo = statistics.median(w), min(w)
        entry = {"argv": cli, "walls_s": w, "median_s": med, "min_s": lo, "cpu_s": cpus[name],
                 "cpu_median_s": statistics.median(cpus[name]),
                 "imports": _imported([py, "-m", "tensordiff.commands.cli", *cli], env)}
        if kind == "torch+":
            # CPU seconds over torch's: on a loaded machine the steadier of the two figures
            entry.update(over_torch_s=med - torch_med, over_torch_min_s=lo - torch_min,
                         over_torch_cpu_s=entry["cpu_median_s"] - torch_cpu,
                         over_frozen_torch_s=med - res[FROZEN]["median_s"],
                         target=f"<= torch import + {limit} s", met=med - torch_med <= limit)
        else:
            entry.update(target=f"<= {limit} s", met=med <= limit)
        res["commands"][name] = entry
    (args.out / "command_time.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"import torch: median {torch_med:.3f} s, min {torch_min:.3f} s (load {res['load_average'][0]:.2f}; "
          f"bytecode {res['bytecode']}); {FROZEN}: median {res[FROZEN]['median_s']:.3f} s")
    for name, e in res["commands"].items():
        extra = (f"  torch + {e['over_torch_s']:+.3f} s (min {e['over_torch_min_s']:+.3f}, "
                 f"CPU {e['over_torch_cpu_s']:+.3f}; frozen torch + {e['over_frozen_torch_s']:+.3f})"
                 if "over_torch_s" in e else "")
        heavy = ",".join(k for k in ("transformers", "scipy", "sympy") if e["imports"][k]) or "-"
        print(f"{name:38s} median {e['median_s']:.3f} s{extra}  [{e['target']}: {'met' if e['met'] else 'NOT met'}]"
              f"  heavy imports: {heavy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
