"""The bf16 verdict table (issue 11's "Done when"): floors, clean ratios and each fault's ratios.

    python bench/bf16_verdict.py --out OUT [--weights synthetic:full] [--device cuda] [--quick]

Per model, on photographs from scikit-image (PNG and JPEG) and a very wide and a very tall crop:
the oracle in float32 (reference) and bfloat16 (floor run), the clean engine in bfloat16, and the
engine with each fault in bfloat16 (numeric pass, `tensordiff.judge.floor.three_way`); the approximation
faults also in float32 (semantic pass, `compare_dumps`). Writes OUT/bf16_verdict.json and
OUT/bf16_verdict.md: per boundary the floor (relative RMSE), the clean engine's ratios over the
pictures (min / median / max per statistic) and each fault's ratios and verdict.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Faults measured per model: (name, pass that must catch it). "numeric" faults are ours (1-5x the
# floor); "semantic" ones are approximations the numeric pass cannot see (shown for the record).
FAULTS = {
    "deepseek-v4.1-flash": [("residual-scale", "numeric"), ("tail-row-scale", "numeric"), ("norm-eps", "numeric"),
                            ("splitk-bf16", "numeric"), ("gelu-tanh", "semantic")],
    "qwen3-vl": [("vision-gelu-erf", "semantic"), ("merger-gelu-tanh", "semantic")],
}
FAULT_IMAGES = 3  # faults run on the first pictures only (the clean engine runs on all)


def pictures(d: Path, quick: bool) -> list[Path]:
    """scikit-image photographs saved as PNG and JPEG, plus a very wide and a very tall crop."""
    import numpy as np
    import skimage.data as sk
    from PIL import Image

    def rgb(a):
        a = np.asarray(a)
        return Image.fromarray(a if a.ndim == 3 else np.stack([a] * 3, -1)).convert("RGB")

    photos = [("astronaut", "png"), ("chelsea", "jpg"), ("coffee", "png"), ("rocket", "jpg"), ("camera", "png"),
              ("hubble_deep_field", "jpg"), ("immunohistochemistry", "png"), ("retina", "jpg")]
    if quick:
        photos = photos[:2]
    out = []
    for name, ext in photos:
        p = d / f"{name}.{ext}"
        rgb(getattr(sk, name)()).save(p, quality=90) if ext == "jpg" else rgb(getattr(sk, name)()).save(p)
        out.append(p)
    coffee = rgb(sk.coffee())
    w, h = coffee.size
    wide, tall = d / "wide-crop.png", d / "tall-crop.jpg"
    coffee.crop((0, h // 2 - 20, w, h // 2 + 20)).save(wide)  # 600x40
    rgb(sk.rocket()).crop((200, 0, 248, 427)).save(tall, quality=90)  # 48x427
    return out + [wide, tall]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", default="synthetic:tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default=",".join(FAULTS))
    ap.add_argument("--quick", action="store_true", help="two photographs and the crops (a CPU smoke run)")
    ap.add_argument("--pictures", type=int, default=0, help="use only the first N pictures (0: all)")
    ap.add_argument("--fault-images", type=int, default=FAULT_IMAGES, help="pictures the faults run on")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds: past it, remaining fault runs are skipped (and listed) so the table is written")
    a = ap.parse_args(argv)
    from tensordiff.judge.floor import DEFAULT_RULE, RATIOS
    from tensordiff.pipeline.case import CaseSpec, run_case

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bf16-verdict-"))
    t0 = time.perf_counter()
    result = {"weights": a.weights, "device": a.device, "rule": DEFAULT_RULE.as_dict(), "models": {}, "skipped": []}

    def save():  # after every picture: a run cut short still leaves its table
        result["seconds"] = time.perf_counter() - t0
        (out / "bf16_verdict.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (out / "bf16_verdict.md").write_text(table(result, RATIOS))
    try:
        imgs = pictures(tmp, a.quick)
        imgs = imgs[:a.pictures] if a.pictures > 0 else imgs
        result["images"] = [p.name for p in imgs]
        for model in a.models.split(","):
            m = result["models"][model] = {"clean": {}, "faults": {}, "semantic": {}, "detectable": {}, "floor": {}}
            if time.perf_counter() - t0 > a.budget * 0.5 and model != a.models.split(",")[0]:
                imgs = imgs[:max(3, len(imgs) // 2)]  # keep the second model's clean set inside the budget
                result.setdefault("notes", []).append(f"{model}: only {len(imgs)} pictures (time budget)")
            for i, img in enumerate(imgs):
                # the gate's own pipeline: oracle fp32 (reference) and bf16 (floor run), both cached
                spec = CaseSpec(model, image=img, weights=a.weights, device=a.device, dtype="bfloat16",
                                passes=("numeric",))
                work = tmp / f"{model}-{i}"
                work.mkdir(parents=True)
                rep = run_case(spec, work / "clean", kept=False).report
                m["clean"][img.name] = {"verdict": rep.verdict, "earliest": rep.earliest, "ratios": _ratios(rep)}
                if i == 0:
                    m["floor"] = {t.name: t.metrics["floor"] for b in rep.boundaries for t in b.tensors
                                  if t.mode == "floor"}
                    m["detectable"] = {t.name: t.metrics["detectable"] for b in rep.boundaries for t in b.tensors
                                       if t.mode == "floor"}
                print(f"{model} {img.name}: clean {rep.verdict} {rep.earliest} ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
                save()
                if i >= a.fault_images:
                    shutil.rmtree(work, ignore_errors=True)
                    continue
                for fault, kind in FAULTS[model]:
                    if time.perf_counter() - t0 > a.budget:
                        result["skipped"].append(f"{model} {img.name} {fault}")
                        continue
                    passes = ("semantic", "numeric") if kind == "semantic" else ("numeric",)
                    case = run_case(replace(spec, fault=fault, passes=passes), work / fault, kept=False)
                    frep = case.numeric if case.numeric is not None else case.report
                    m["faults"].setdefault(fault, {})[img.name] = {
                        "pass": kind, "verdict": frep.verdict, "earliest": frep.earliest, "ratios": _ratios(frep),
                        "outliers": {t.name: t.metrics.get("outliers") for b in frep.boundaries for t in b.tensors
                                     if t.mode == "floor"}}
                    if kind == "semantic":
                        m["semantic"].setdefault(fault, {})[img.name] = {"verdict": case.report.verdict,
                                                                          "earliest": case.report.earliest}
                    print(f"  {fault}: numeric {frep.verdict} {frep.earliest}"
                          + (f", semantic {m['semantic'][fault][img.name]}" if kind == "semantic" else ""), flush=True)
                shutil.rmtree(work, ignore_errors=True)
                save()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save()
    print(f"wrote {out / 'bf16_verdict.json'} and {out / 'bf16_verdict.md'} ({result['seconds']:.0f} s)")
    return 0


def _ratios(rep) -> dict:
    return {t.name: {**t.metrics["ratios"], "worst_row": (t.metrics["worst_rows"] or [{}])[0].get("x_floor")}
            for b in rep.boundaries for t in b.tensors if t.mode == "floor" and not t.metrics.get("exact_floor")}


def table(res: dict, stats) -> str:
    L = [f"# bf16 verdicts ({res['weights']}, {res['device']}, {len(res.get('images', []))} pictures, "
         f"{res.get('seconds', 0):.0f} s)", "", f"rule: {res['rule']}", ""]
    L += [f"note: {n}" for n in res.get("notes", [])] + [f"skipped (time budget): {s}" for s in res.get("skipped", [])]
    for model, m in res["models"].items():
        L += [f"## {model}", "", "| tensor | floor rel. RMSE | detectable (tensor / one row) | "
              + " | ".join(f"clean {s} min/med/max" for s in (*stats, "worst_row")) + " | "
              + " | ".join(m["faults"]) + " |",
              "|" + "---|" * (3 + len(stats) + 1 + len(m["faults"]))]
        names = list(m["floor"])
        if not names:
            L.append("(no picture finished)")
            continue
        for n in names:
            fl = m["floor"][n]
            det = m["detectable"][n]
            cells = [n, f"{fl['relative']:.3g}", f"{det['tensor']:.3g} / {det['row']:.3g}"]
            for s in (*stats, "worst_row"):
                v = [c["ratios"][n][s] for c in m["clean"].values() if n in c["ratios"]]
                cells.append(f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}" if v else "exact")
            for f, per in m["faults"].items():
                rs = [c["ratios"].get(n) for c in per.values() if c["ratios"].get(n)]
                caught = [c for c in per.values() if n in c["earliest"]]
                cells.append((f"rmse {max(r['rmse'] for r in rs):.3g}, row {max(r['worst_row'] for r in rs):.3g}"
                              if rs else "exact") + (f" **root {len(caught)}/{len(per)}**" if caught else ""))
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
        L.append("clean verdicts: " + ", ".join(f"{k}: {v['verdict']}" for k, v in m["clean"].items()))
        for f, per in m["faults"].items():
            L.append(f"- {f} (numeric): " + ", ".join(f"{k}: {v['verdict']} {v['earliest']}" for k, v in per.items()))
        for f, per in m["semantic"].items():
            L.append(f"- {f} (semantic, float32): " + ", ".join(f"{k}: {v['verdict']} {v['earliest']}"
                                                                for k, v in per.items()))
        L.append("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
