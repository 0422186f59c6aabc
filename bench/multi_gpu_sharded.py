"""The sharded DeepSeek language check: the unsharded oracle, then torchrun of the tensor- and
expert-parallel engine (one process per rank), each run's rank dumps merged and compared.

    python bench/multi_gpu_sharded.py --out OUT                       # one GPU: 2 ranks on it, bf16, tiny
    python bench/multi_gpu_sharded.py --out OUT --nproc 8 --config full --layers 2    # 8 GPUs, real dims
    python bench/multi_gpu_sharded.py --out OUT --device cpu --dtype float32          # gloo on the CPU

Runs the clean check and the three sharded faults (`--faults none` skips them). On CUDA the
collectives are NCCL; ranks sharing one GPU make NCCL refuse ("duplicate GPU"), so then the
check is run again with gloo on CUDA tensors (the engine reduces host copies) and the JSON says
which backend ran and why. NVLink multicast is switched off for every process torchrun starts
(`NO_MULTICAST`, recorded in each rank's manifest).

OUT/multi_gpu_sharded.json: per check the torchrun wall time, each rank's peak GPU memory and
own run time (from its manifest), the merge + compare time, the verdict, the earliest boundary
and the ranks the report names; OUT/dumps holds the dumps, OUT/logs the processes' output.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PROMPT = "Describe <image>."
FAULTS = ("shard-order-reversed", "partial-as-replicated", "expert-bias-shift")


def env() -> dict:
    return {**os.environ, **NO_MULTICAST, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "PYTHONUNBUFFERED": "1"}


def run(cmd: list, log: Path, timeout: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env(),
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - t0


def common(a, weights: str) -> list:
    out = ["--weights", weights, "--device", a.device, "--dtype", a.dtype, "--prompt", PROMPT,
           "-o", f"language_numerics={a.numerics}"]
    return out + (["--layers", a.layers] if a.layers else [])


def compare(oracle: Path, ranks: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.format.dump import open_dump

    t0 = time.perf_counter()
    rep = compare_dumps(oracle, ranks)
    out = {"merge_compare_s": time.perf_counter() - t0, "verdict": rep.verdict, "earliest": rep.earliest,
           "named": {}}
    for b in rep.boundaries:
        for t in b.tensors:
            if t.ranks is not None and b.name in rep.earliest:
                out["named"][t.name] = {"ranks": t.ranks, "reason": t.reason[:300]}
    d = open_dump(ranks)  # each rank's own facts, from its manifest
    out["ranks"] = {}
    for r in range(d.world or 0):
        m = json.loads((ranks / f"rank{r}" / "manifest.json").read_text())
        out["ranks"][r] = m["run"].get("rank_facts", {})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nproc", type=int, default=int(os.environ.get("NPROC", 2)))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--numerics", default="official", choices=("official", "semantic"))
    ap.add_argument("--config", default="tiny", choices=("tiny", "full"),
                    help="tiny: synthetic:tiny; full: the released dimensions for --layers (bench/real_dims_layers.py)")
    ap.add_argument("--layers", default=os.environ.get("LAYERS") or None)
    ap.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    ap.add_argument("--faults", default="all", help="all, none, or a comma list of " + ", ".join(FAULTS))
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # one rank of the NCCL probe
    ap.add_argument("--timeout", type=int, default=300, help="seconds per process")
    a = ap.parse_args()
    if a.probe:
        return probe_rank()
    if (a.out / "dumps").exists():
        raise SystemExit(f"{a.out}/dumps exists; give an empty --out")
    dumps, logs = a.out / "dumps", a.out / "logs"
    dumps.mkdir(parents=True)
    logs.mkdir()
    result: dict = {"nproc": a.nproc, "device": a.device, "dtype": a.dtype, "numerics": a.numerics,
                    "config": a.config, "layers": a.layers, "env": NO_MULTICAST, "checks": {}}
    weights = "synthetic:tiny"
    if a.config == "full":
        sys.path.insert(0, str(ROOT / "bench"))
        sys.path.insert(0, str(ROOT))
        from real_dims_layers import parse_ids, write_checkpoint

        t0 = time.perf_counter()
        weights = str(write_checkpoint(a.out / "ckpt", parse_ids(a.layers or "2")))
        result["write_checkpoint_s"] = time.perf_counter() - t0
        a.layers = a.layers or "2"
    if a.device == "cuda":  # this driver imports torch for nothing else: a CPU run leaves it to the ranks
        try:
            import torch

            result["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as e:  # noqa: BLE001 - only a fact for the report
            result["gpus"] = f"unknown ({e})"
    oracle = dumps / "oracle"
    rc, secs = run([sys.executable, "-m", "tensordiff.commands.cli", "dump", "deepseek-v4.1-flash", "--side", "oracle",
                    "--out", oracle, *common(a, weights)], logs / "oracle.txt", a.timeout)
    result["oracle"] = {"exit": rc, "wall_s": secs}
    if rc != 0:
        result["error"] = "the oracle failed: see logs/oracle.txt"
        return write(a.out, result)
    backend = a.backend if a.backend != "auto" else ("nccl" if a.device == "cuda" else "gloo")
    if backend == "nccl" and a.backend == "auto":
        # NCCL refuses ranks that share a GPU (or may hang on it): a one-collective probe decides
        rc, secs = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", a.nproc,
                        __file__, "--probe", "--out", a.out], logs / "nccl_probe.txt", 120)
        result["nccl_probe"] = {"exit": rc, "wall_s": secs}
        if rc != 0:
            result["nccl_probe"]["error"] = (logs / "nccl_probe.txt").read_text()[-1500:]
            backend = "gloo"  # gloo on CUDA tensors: the engine reduces host copies
    result["backend"] = backend
    wanted = list(FAULTS) if a.faults == "all" else [] if a.faults == "none" else a.faults.split(",")
    unknown = [f for f in wanted if f not in FAULTS]
    if unknown:
        raise SystemExit(f"unknown fault {unknown[0]!r} (known: {', '.join(FAULTS)})")
    checks = ["clean"] + wanted
    for check in checks:
        def torchrun(be: str, tag: str):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", a.nproc,
                   "-m", "engine.deepseek_v41_flash.distributed", "--out", dumps / tag, "--dist-backend", be,
                   *common(a, weights), "-o", "fuse=off", "-o", "graphs=off"] + (
                       [] if check == "clean" else ["--fault", check])  # the tower eager: no compile per rank
            return run(cmd, logs / f"{tag}.txt", a.timeout)

        rc, secs = torchrun(backend, check)
        entry = {"backend": backend, "exit": rc, "torchrun_wall_s": secs}
        if rc != 0 and backend == "nccl" and a.backend == "auto":
            tail = (logs / f"{check}.txt").read_text()[-1500:]
            backend = "gloo"  # NCCL refuses ranks sharing a device: gloo on CUDA tensors from here on
            rc, secs = torchrun(backend, f"{check}-gloo")
            entry = {"backend": backend, "exit": rc, "torchrun_wall_s": secs, "nccl_failed": tail}
            check_dir = dumps / f"{check}-gloo"
        else:
            check_dir = dumps / check
        if rc == 0:
            entry.update(compare(oracle, check_dir))
            if check != "clean":
                entry["caught"] = entry["verdict"] == "diverged"
        result["checks"][check] = entry
        print(f"{check}: backend {entry['backend']}, exit {rc}, {secs:.1f} s, verdict {entry.get('verdict')}, "
              f"earliest {entry.get('earliest')}", flush=True)
    write(a.out, result)


def probe_rank() -> None:
    """One rank of the NCCL probe: one all-reduce on this rank's GPU."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)
    assert float(t[0]) == dist.get_world_size()
    dist.destroy_process_group()


def write(out: Path, result: dict) -> None:
    (out / "multi_gpu_sharded.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'multi_gpu_sharded.json'}")


if __name__ == "__main__":
    main()
