"""Qwen3-VL language path on one GPU: the bf16 three-way verdict (the gate's numeric pass) on
photographs with the clean engine (no false alarm allowed), every language fault caught, and the
wall time of one full-2b check.

    python bench/qwen_language.py --out DIR [--weights synthetic:full-2b] [--device cuda]

Writes DIR/qwen_language.json and DIR/qwen_language.md. Photographs: four scikit-image pictures
written as PNG when scikit-image is importable, else the gate's bundled pictures (the JSON says
which). A time budget skips what is left, and says so, rather than running over.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "Here is a photo: <image> What does it show?"
CHUNK, DECODE = 16, 3


def photographs(out: Path) -> tuple[list[Path], str]:
    try:
        import numpy as np
        import skimage.data
        from PIL import Image
    except ImportError:
        gates = ROOT / "gates" / "images"
        return [gates / "qwen-odd-150x230.png", gates / "qwen-tiny-40x60.png"], "bundled (no scikit-image)"
    paths = []
    for name in ("astronaut", "chelsea", "coffee", "rocket"):
        a = getattr(skimage.data, name)()
        a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
        p = out / "photos" / f"{name}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.ascontiguousarray(a)).save(p)
        paths.append(p)
    return paths, "scikit-image"


def case(weights: str, device: str, images: list[Path], dtype: str) -> dict:
    return {"name": "qwen3-vl", "weights": weights, "device": device, "dtype": dtype,
            "images": [str(p) for p in images], "prompts": [PROMPT], "chunk": CHUNK, "decode": DECODE,
            "local_error": False}


def summarise(res) -> list[dict]:
    rows = []
    for c in res.cases:
        rows.append({"image": Path(str(c.image)).name, "passed": c.passed, "error": c.error,
                     "semantic": c.report.verdict if c.report is not None else None,
                     "semantic_earliest": list(c.report.earliest) if c.report is not None else None,
                     "numeric": c.numeric.verdict if c.numeric is not None else None,
                     "numeric_earliest": list(c.numeric.earliest) if c.numeric is not None else None,
                     "seconds": round(sum(c.timings.values()), 2), "line": c.summary_line()})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--weights", default="synthetic:full-2b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; what is left after it is skipped")
    ap.add_argument("--photos", type=int, default=4, help="how many of the photographs (smoke runs: fewer)")
    ap.add_argument("--faults", default="", help="comma-separated language faults (default: all)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from tensordiff.pipeline import registry
    from tensordiff.commands.gate import from_mapping, run_gate
    from tensordiff.models.qwen3_vl.faults import LANGUAGE_FAULTS

    t0 = time.perf_counter()
    adapter = registry.adapter("qwen3-vl")
    tw = time.perf_counter()
    adapter.weights(args.weights)  # written once (synthetic), outside the timed check
    report: dict = {"weights": args.weights, "device": args.device, "prompt": PROMPT, "chunk": CHUNK,
                    "decode": DECODE, "weights_seconds": round(time.perf_counter() - tw, 1), "skipped": []}
    images, source = photographs(args.out)
    images = images[:max(1, args.photos)]
    report["photographs"] = {"source": source, "files": [p.name for p in images]}

    def gate(images, fault=None):
        cfg = from_mapping({"gate": {"cache": True}, "model": [case(args.weights, args.device, images, "bfloat16")]})
        return run_gate(cfg, fault=fault, progress=False, echo=lambda s: None)

    # 1. the time of one full check (bf16 engine: semantic pass + the numeric three-way verdict),
    # cold oracle cache; then the clean engine on every photograph (no false alarm allowed)
    t = time.perf_counter()
    first = gate(images[:1])
    report["one_check_seconds"] = round(time.perf_counter() - t, 1)
    report["one_check_stage_seconds"] = {k: round(v, 2) for k, v in first.cases[0].timings.items()}
    clean = summarise(first)
    if len(images) > 1:
        clean += summarise(gate(images[1:]))
    report["clean"] = clean
    report["false_alarms"] = [r["image"] for r in clean if not r["passed"]]

    # 2. every language fault on the first photograph: must fail, at its boundary
    import fnmatch

    faults = []
    wanted = [n for n in args.faults.split(",") if n]
    for f in LANGUAGE_FAULTS:
        if wanted and f.name not in wanted:
            continue
        if time.perf_counter() - t0 > args.budget:
            report["skipped"].append(f.name)
            continue
        res = gate(images[:1], fault=f.name)
        rows = summarise(res)
        caught = res.exit_code == 1 and all(
            r["semantic_earliest"] and all(fnmatch.fnmatchcase(e, f.boundary) for e in r["semantic_earliest"])
            for r in rows)
        faults.append({"fault": f.name, "boundary": f.boundary, "exit": res.exit_code, "caught_at_boundary": caught,
                       "cases": rows})
    report["faults"] = faults
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    ok = not report["false_alarms"] and all(f["caught_at_boundary"] for f in faults)
    report["ok"] = ok

    (args.out / "qwen_language.json").write_text(json.dumps(report, indent=1) + "\n")
    md = [f"# Qwen3-VL language path, {args.weights} on {args.device}, bf16", "",
          f"one check (cold oracle cache): {report['one_check_seconds']} s; weights ready in "
          f"{report['weights_seconds']} s; total {report['total_seconds']} s", "",
          "| picture | semantic | numeric (three-way) | s |", "|---|---|---|---|"]
    md += [f"| {r['image']} | {r['semantic']} | {r['numeric']} | {r['seconds']} |" for r in clean]
    md += ["", "| fault | boundary | exit | caught at boundary |", "|---|---|---|---|"]
    md += [f"| {f['fault']} | {f['boundary']} | {f['exit']} | {f['caught_at_boundary']} |" for f in faults]
    if report["skipped"]:
        md += ["", f"skipped (time budget): {', '.join(report['skipped'])}"]
    (args.out / "qwen_language.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
