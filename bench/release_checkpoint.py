"""DeepSeek V4.1 Flash stored as the released shards are, through `tensordiff check` and
`tensordiff gate` on the default route (default options; bf16 runs take the semantic and the
numeric pass, the gate adds local error).

    # GPU, the released dimensions on a layer subset (a partial download: vision, embedding, head
    # and layer 2 in the release's storage, ~11 GB; written into TENSORDIFF_CACHE on first use)
    python bench/release_checkpoint.py --out OUT --weights synthetic:full-layers-2 --layers 2 \
        --device cuda --dtype bfloat16
    # CPU smoke: the tiny config in the same storage
    python bench/release_checkpoint.py --out OUT

Steps, each timed on the wall clock with the peak GPU memory of this process during it
(`torch.cuda.max_memory_allocated`, reset before each step; null on the CPU):
  prepare  the weights resolved (a synthetic checkpoint written on first use) and described as
           `tensordiff inspect` describes it (formats, conversions, bytes a run reads); a
           checkpoint a run cannot read stops here (exit 2);
  check    `tensordiff check` on the image and prompt (the oracle's dumps go to the cache);
  gate     `tensordiff gate` on a gate file written to OUT for the same case (the cached oracle
           dumps are reused; local error on).
Writes OUT/release_checkpoint.json and prints the same JSON: layers, wall seconds, peak GPU GiB,
exit status and verdict per step, and the checkpoint facts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MODEL = "deepseek-v4.1-flash"
PROMPT = "Describe <image> in one sentence."


def _gpu(device: str, reset: bool = False):
    import torch

    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    if reset:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _command(args: list[str]) -> int:
    from tensordiff.commands.cli import main

    try:
        main([str(a) for a in args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _step(name: str, device: str, run, result: dict) -> dict:
    _gpu(device, reset=True)
    t = time.perf_counter()
    facts = run()
    step = {"wall_s": round(time.perf_counter() - t, 2), "peak_gpu_gib": _gpu(device), **facts}
    result["steps"][name] = step
    print(f"{name}: {json.dumps(step)}", file=sys.stderr, flush=True)
    _save(result)  # after every step: a run cut short keeps what it measured
    return step


def _save(result: dict) -> str:
    text = json.dumps(result, indent=1, default=str)
    (Path(result["out"]) / "release_checkpoint.json").write_text(text + "\n")
    return text


def _gate_file(out: Path, a) -> Path:
    model = {"name": MODEL, "weights": a.weights, "images": [a.image or "tensordiff:default"],
             "prompts": [a.prompt], "dtype": a.dtype, "device": a.device, "local_error": True}
    if a.layers:
        model["layers"] = a.layers
    lines = ["[gate]", 'name = "release checkpoint: engine vs oracle"', "cache = true", "", "[[model]]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in model.items()]
    path = out / "release_checkpoint_gate.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--weights", default="synthetic:tiny-fp8",
                    help="synthetic:tiny-fp8 (CPU), synthetic:full-layers-IDS (GPU) or a checkpoint directory")
    ap.add_argument("--layers", default=None, help="the language layers a run takes (--layers of check and gate)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--image", default=None, help="default: the embedded 1024x701 picture")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--steps", default="check,gate", help="which of check, gate run after prepare")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    steps = [s.strip() for s in a.steps.split(",") if s.strip()]
    if not set(steps) <= {"check", "gate"}:
        ap.error(f"--steps takes check and gate, not {a.steps!r}")

    from tensordiff.pipeline import registry

    adapter = registry.adapter(MODEL)
    result: dict = {"out": str(a.out), "weights": a.weights, "layers": a.layers, "device": a.device, "dtype": a.dtype,
                    "image": a.image or "tensordiff:default", "prompt": a.prompt, "steps": {}}
    if a.device.startswith("cuda"):
        import torch

        result["gpu"] = torch.cuda.get_device_name(torch.device(a.device))

    def prepare() -> dict:
        ckpt = adapter.weights(a.weights)
        view = adapter.checkpoint()(ckpt, a.layers)
        return {"checkpoint": str(ckpt), "present_layers": list(view.present_layers),
                "run_layers": list(view.run_layers), "conversions": view.conversions,
                "stored": {g: dict(f) for g, f in view.groups.items()},
                "reads_gb": {k: round(v / 1e9, 3) for k, v in view.reads.items()},
                "hashed_gb": round(view.hashed / 1e9, 3), "problems": view.problems}

    common = ["--weights", a.weights, "--device", a.device, "--dtype", a.dtype]
    common += ["--layers", a.layers] if a.layers else []

    def check() -> dict:
        rep = a.out / "check.json"
        args = ["check", MODEL, *common, "--prompt", a.prompt, "--json", rep]
        args += ["--image", a.image] if a.image else []
        code = _command(args)
        if not rep.is_file():
            return {"exit": code}
        r = json.loads(rep.read_text())
        return {"exit": code, "verdict": r["verdict"], "earliest": r["earliest"], "passes": r.get("passes"),
                "boundaries": len(r["boundaries"]), "local_error_origin": (r.get("local_error") or {}).get("origin")}

    def gate() -> dict:
        rep = a.out / "gate.json"
        code = _command(["gate", _gate_file(a.out, a), "--json", rep, "-q"])
        if not rep.is_file():
            return {"exit": code}
        r = json.loads(rep.read_text())
        cases = r["cases"]
        return {"exit": code, "verdict": r["verdict"], "timings": r["timings"],
                "oracle_cache": [c.get("oracle_cache") for c in cases],
                "earliest": [(c.get("report") or {}).get("earliest") for c in cases],
                "local_error_origin": [(c.get("local_error") or {}).get("origin") for c in cases]}

    status = 0
    if _step("prepare", a.device, prepare, result)["problems"]:
        status = 2
    else:
        for name in steps:
            code = _step(name, a.device, check if name == "check" else gate, result)["exit"]
            status = max(status, code)
    result["exit"] = status
    print(_save(result))
    return status


if __name__ == "__main__":
    sys.exit(main())
