"""The clean engine's profile across images, repeated runs, the compiled path and weight seeds
(issue 11, "The engine's own profile"), and a calibrated gate on the compiled engine.

Steps, in order, each under what is left of a time budget (a step that would not fit is skipped
and the JSON says so; results are written after every step):

  1. eager: `calibrate` with the engine's fuse=off, graphs=off, `repeats` runs per image
  2. compiled: the same with fuse=on, graphs=on (the oracle's dumps are reused from the cache:
     engine options never change them)
  3. shift: per boundary and statistic, compiled against eager (median ratio, and whether the
     compiled runs leave the eager profile's band, i.e. whether an eager profile could judge them)
  4. gate: the compiled engine under the compiled calibration, numeric pass, clean and with each
     numeric fault; the eager calibration on the compiled engine is refused (exit 2)
  5. seed: the eager profile measured on the weights of another seed (`<weights>-s2`), whether
     its ratios stay inside the seed-0 band (does a profile transfer across weights?); the gate
     calibrated on seed 0 refuses seed-2 weights

    python bench/profile_spread.py OUTDIR            # H200: synthetic:full, cuda, bf16, 4 photographs
    python bench/profile_spread.py OUTDIR --smoke    # CPU: synthetic:tiny, 2 small pictures
Writes OUTDIR/profile_spread.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tensordiff.models.deepseek_v41_flash.faults import NORM_EPS, RESIDUAL_SCALE, SPLITK_BF16, TAIL_ROW_SCALE

MODEL = "deepseek-v4.1-flash"
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
FAULTS = (RESIDUAL_SCALE, NORM_EPS, SPLITK_BF16, TAIL_ROW_SCALE)
EAGER = ("fuse=off", "graphs=off")
COMPILED = ("fuse=on", "graphs=on")
FAULT_IMAGES = 2  # the faults run on the first pictures (the clean gate on all)


class OutOfBudget(BaseException):
    """Raised by the budget's alarm inside a step (a BaseException: no `except Exception` of the
    engine's fallbacks may swallow it)."""


def _alarm(signum, frame):
    raise OutOfBudget()


def pictures(d: Path, smoke: bool) -> list[Path]:
    import numpy as np
    from PIL import Image

    d.mkdir(parents=True, exist_ok=True)
    out = []
    if smoke:  # no scikit-image needed: two small synthetic pictures of different geometry
        rng = np.random.default_rng(0)
        for name, (h, w) in (("noise-a", (64, 96)), ("noise-b", (80, 56))):
            p = d / f"{name}.png"
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
            out.append(p)
        return out
    import skimage.data as sk

    for i, name in enumerate(PHOTOS):
        p = d / f"{name}.{'jpg' if i % 2 else 'png'}"
        Image.fromarray(getattr(sk, name)()).convert("RGB").save(p, **({"quality": 90} if i % 2 else {}))
        out.append(p)
    return out


def profile_json(cal) -> dict:
    """boundary -> stat -> {min, median, max, n, images, repeats, image_spread, run_spread,
    per_image: {image: [ratio per run]}}."""
    runs = cal.profile.by_image
    return {name: {s: {**v, "per_image": {k.split(":", 1)[1]: r for k, r in runs.get(name, {}).get(s, {}).items()}}
                   for s, v in per.items() if s != "equals_floor_run"}
            for name, per in cal.profile.summary().items()}


def shift(eager: dict, compiled: dict) -> dict:
    from tensordiff.judge.floor import profile_band

    out = {}
    for name, per in compiled.items():
        band = profile_band(eager.get(name))
        for stat, c in per.items():
            e = eager.get(name, {}).get(stat)
            if e is None:
                continue
            lo, hi = band.get(stat, (e["min"], e["max"]))
            out.setdefault(name, {})[stat] = {
                "eager_median": e["median"], "compiled_median": c["median"],
                "median_shift": c["median"] - e["median"],
                "eager_band": [lo, hi], "compiled_range": [c["min"], c["max"]],
                "compiled_inside_eager_band": lo <= c["min"] and c["max"] <= hi}
    return out


def transfer(base: dict, other: dict) -> dict:
    """Does the `other` weights' clean profile stay inside `base`'s band, per boundary/stat?"""
    from tensordiff.judge.floor import profile_band

    out = {}
    for name, per in other.items():
        band = profile_band(base.get(name))
        for stat, o in per.items():
            if stat in band:
                lo, hi = band[stat]
                out.setdefault(name, {})[stat] = {"band": [lo, hi], "range": [o["min"], o["max"]],
                                                  "inside": lo <= o["min"] and o["max"] <= hi}
    return out


def speed_paths(root: Path) -> list:
    """What the engine's manifests say ran (fused blocks, CUDA graphs), deduplicated."""
    seen = []
    for m in sorted(root.rglob("manifest.json")):
        try:
            run = json.loads(m.read_text()).get("run", {})
        except (OSError, ValueError):
            continue
        sp = run.get("speed_path")
        if sp and sp not in seen:
            seen.append(sp)
    return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU, synthetic:tiny, 2 small pictures, 2 repeats")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--fault-images", type=int, default=FAULT_IMAGES,
                    help=f"pictures the gate's faults run on (default {FAULT_IMAGES}; the clean gate runs on all)")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds for all steps (a step that would "
                                                                 "not fit in what is left is skipped)")
    a = ap.parse_args(argv)
    if a.fault_images < 1:
        print(f"profile_spread: --fault-images must be at least 1, not {a.fault_images}", file=sys.stderr)
        return 2
    from tensordiff.commands.calibrate import calibrate
    from tensordiff.pipeline.calibration import write
    from tensordiff.errors import BadInput
    from tensordiff.commands.gate import from_mapping, run_gate

    weights = a.weights or ("synthetic:tiny" if a.smoke else "synthetic:full")
    device = a.device or ("cpu" if a.smoke else "cuda")
    repeats = a.repeats or (2 if a.smoke else 3)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict = {"model": MODEL, "weights": weights, "device": device, "dtype": "bfloat16", "repeats": repeats,
                 "fault_images": a.fault_images,
                 "smoke": a.smoke, "steps": {}, "skipped": []}
    imgs = pictures(a.out / "pictures", a.smoke)
    res["images"] = [p.name for p in imgs]

    def save():
        res["total_s"] = round(time.perf_counter() - t0, 2)
        (a.out / "profile_spread.json").write_text(json.dumps(res, indent=1) + "\n")

    signal.signal(signal.SIGALRM, _alarm)

    def step(name: str, need: float, fn):
        left = a.budget - (time.perf_counter() - t0)
        if left < max(need, 1.0):
            res["skipped"].append(f"{name}: {left:.0f} s left of the {a.budget:g} s budget, needs ~{need:g} s")
            print(f"skip {name}", flush=True)
            save()
            return None
        t = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, left)  # a step never runs past the budget
        try:
            out = fn()
        except OutOfBudget:
            res["skipped"].append(f"{name}: cut by the budget after {time.perf_counter() - t:.0f} s")
            print(f"cut {name}", flush=True)
            save()
            return None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        res["steps"][name] = round(time.perf_counter() - t, 2)
        print(f"{name}: {res['steps'][name]} s", flush=True)
        save()
        return out

    echo = (lambda s: print("  " + s, flush=True))
    cal_kw = dict(weights=weights, device=device, variants=["dtype=bfloat16"], repeats=repeats, echo=echo)
    eager = step("eager", 0, lambda: calibrate(MODEL, imgs, options=EAGER, **cal_kw))
    if eager is None:
        return 1
    write(eager, a.out / "calibration-eager.toml")
    res["eager"] = {"engine": eager.engine, "failed": eager.profile.failed, "profile": profile_json(eager)}
    est = res["steps"]["eager"]  # the oracle is cached from here on: later steps cost less
    compiled = step("compiled", 0.5 * est, lambda: calibrate(MODEL, imgs, options=COMPILED, **cal_kw))
    if compiled is not None:
        write(compiled, a.out / "calibration-compiled.toml")
        res["compiled"] = {"engine": compiled.engine, "failed": compiled.profile.failed,
                           "profile": profile_json(compiled)}
        res["shift"] = shift(res["eager"]["profile"], res["compiled"]["profile"])
        save()

    def gate_table(tol: Path, w: str = weights, opts: tuple = COMPILED, imgs: list = imgs) -> dict:
        return {"gate": {"name": "profile_spread gate", "cache": True},
                "model": [{"name": MODEL, "weights": w, "images": [str(p) for p in imgs], "dtype": "bfloat16",
                           "device": device, "tolerances": str(tol), "local_error": False, "passes": ["numeric"],
                           "options": dict(o.split("=", 1) for o in opts)}]}

    def summarise(g) -> dict:
        out = {"exit": g.exit_code, "cases": []}
        for c in g.cases:
            rep = c.numeric or c.report
            why = [f"{t.name}: {t.reason}" for b in (rep.boundaries if rep else []) for t in b.tensors
                   if t.status != "match" and t.reason]
            out["cases"].append({"label": c.label, "passed": c.passed, "earliest": rep.earliest if rep else None,
                                 "reason": "; ".join(why)[:300]})
        return out

    if compiled is not None:
        def gates():
            out = {}
            try:
                run_gate(from_mapping(gate_table(a.out / "calibration-eager.toml"), a.out / "gate.toml"),
                         progress=False, echo=echo)
                out["eager_profile_on_compiled"] = "ran (expected a refusal)"
            except BadInput as e:
                out["eager_profile_on_compiled"] = f"refused: {e}"
            cfg = from_mapping(gate_table(a.out / "calibration-compiled.toml"), a.out / "gate.toml")
            few = from_mapping(gate_table(a.out / "calibration-compiled.toml", imgs=imgs[:a.fault_images]),
                               a.out / "gate.toml")
            res["gate"] = out
            for fault in (None, *FAULTS):
                if fault and a.budget - (time.perf_counter() - t0) < 0.3 * est:
                    res["skipped"].append(f"gate fault {fault}: out of budget")
                    continue
                work = Path(tempfile.mkdtemp(prefix="profile-spread-gate-"))  # dumps stay out of OUTDIR
                try:
                    g = run_gate(few if fault else cfg, fault=fault, out=work, progress=False, echo=echo)
                    if fault is None:
                        out["speed_path"] = speed_paths(work)  # what the compiled engine really ran
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                out[fault or "clean"] = summarise(g)
                save()
            return out

        step("gate", 0.5 * est, gates)  # res["gate"] fills case by case (a budget cut keeps what ran)

    g = res.get("gate")
    if g:
        g["clean_passes"] = g.get("clean", {}).get("exit") == 0
        g["faults_caught"] = {f: g[f]["exit"] == 1 for f in FAULTS if f in g}
    seeded = weights + "-s2" if weights.startswith("synthetic:") else None
    if seeded:
        other = step("seed", 0.9 * est, lambda: calibrate(MODEL, imgs, options=EAGER, **{**cal_kw, "weights": seeded,
                                                                                        "repeats": 1}))
        if other is not None:
            res["seed"] = {"weights": seeded, "failed": other.profile.failed, "profile": profile_json(other),
                           "transfer": transfer(res["eager"]["profile"], profile_json(other))}
            res["seed"]["transfers"] = all(v["inside"] for per in res["seed"]["transfer"].values() for v in per.values())
            save()
            # calibrated on seed 0, gated on the other seed: refused (a profile is its weights')
            try:
                run_gate(from_mapping(gate_table(a.out / "calibration-eager.toml", seeded, EAGER), a.out / "gate.toml"),
                         progress=False, echo=echo)
                res["seed"]["gate_seed0_calibration_on_seed2"] = "ran (expected a refusal)"
            except BadInput as e:
                res["seed"]["gate_seed0_calibration_on_seed2"] = f"refused: {e}"
    save()
    print(json.dumps({k: res.get(k) for k in ("steps", "skipped", "total_s")}), flush=True)
    print(f"wrote {a.out / 'profile_spread.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
