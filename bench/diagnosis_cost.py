"""Benchmark: what the diagnosis costs beside the comparison it follows, on the default picture.

    python bench/diagnosis_cost.py OUT                                  # CPU, synthetic:tiny
    python bench/diagnosis_cost.py OUT --weights synthetic:full --device cuda   # GPU (bash bench/gpu.sh OUT diagnosis)

For the clean engine and each planted fault (layout faults, and numeric ones that get no
diagnosis, which is the dearest case: every hypothesis is tried and the stage replay runs), one
case is run (oracle, engine, dumps kept under OUT/dumps), then timed apart:

- compare:   `compare_dumps(A, B, diagnose=False)`, the comparison alone
- diagnose:  the direct hypotheses on the report's roots (`diagnosis.diagnose_report`)
- replay:    the stage replay of the roots left unexplained (`diagnosis.replay.replay_roots`)

each the median of --repeat runs, page-cache warm. The figure is the ratio (diagnose + replay) /
compare per case; OUT/diagnosis_cost.json holds every number, OUT/diagnosis_cost.txt a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

DEFAULT_CASES = (
    ("deepseek-v4.1-flash", None), ("deepseek-v4.1-flash", "rope-interleaved"),
    ("deepseek-v4.1-flash", "aligner-flat-pad"), ("deepseek-v4.1-flash", "contain-ceil"),
    ("deepseek-v4.1-flash", "gelu-tanh"), ("deepseek-v4.1-flash", "residual-scale"),
    ("qwen3-vl", None), ("qwen3-vl", "merge-order-raster"), ("qwen3-vl", "rope-hw-swap"),
    ("qwen3-vl", "merger-gelu-tanh"),
)


def _median(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def one(model: str, fault: str | None, args, root: Path) -> dict:
    from tensordiff.judge.walk import resolve_contract
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.judge.diagnosis import diagnose_report
    from tensordiff.judge.diagnosis.replay import replay_roots
    from tensordiff.format.dump import open_dump
    from tensordiff.pipeline.case import CaseSpec, check

    spec = CaseSpec(model, weights=args.weights, device=args.device, dtype=args.dtype, fault=fault)
    label = f"{model}:{fault or 'clean'}"
    t0 = time.perf_counter()
    case = check(spec, out=root / label.replace(":", "-"))
    run_s = time.perf_counter() - t0
    oa, eb = case.dumps["oracle"], case.dumps["engine"]
    da, db = open_dump(oa), open_dump(eb)
    compare_s, rep = _median(lambda: compare_dumps(da, db, diagnose=False), args.repeat)
    contract, bounds = resolve_contract(da, db, None)

    def diagnose():
        for b in rep.boundaries:
            b.diagnosis = None
        diagnose_report(rep.boundaries, da, db, contract, bounds)

    diagnose_s, _ = _median(diagnose, args.repeat)
    direct = {b.name: b.diagnosis for b in rep.boundaries if b.diagnosis is not None}
    adapter, req = spec.request()

    def replay():
        for b in rep.boundaries:
            if b.name in direct:
                b.diagnosis = list(direct[b.name])
        replay_roots(adapter, req, oa, eb, rep)

    replay_s, _ = _median(replay, args.repeat) if any(v == [] for v in direct.values()) else (0.0, None)
    found = [f["line"] for b in rep.boundaries for f in (b.diagnosis or [])]
    return {"case": label, "earliest": rep.earliest, "tensor_bytes": da.nbytes + db.nbytes, "run_s": round(run_s, 3),
            "compare_s": compare_s, "diagnose_s": diagnose_s, "replay_s": replay_s,
            "ratio": (diagnose_s + replay_s) / compare_s if compare_s else None, "diagnosis": found,
            "no_simple_explanation": [n for n, v in direct.items() if v == [] and not any(
                b.diagnosis for b in rep.boundaries if b.name == n)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--weights", default="synthetic:tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--case", action="append", help="MODEL[:FAULT], repeatable (default: the built-in list)")
    ap.add_argument("--budget", type=float, default=0, help="seconds; cases not started by then are skipped (0: none)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = DEFAULT_CASES if not args.case else [(c.split(":")[0], (c.split(":") + [None])[1]) for c in args.case]
    rows = []
    t0 = time.perf_counter()
    for model, fault in cases:
        if args.budget and time.perf_counter() - t0 > args.budget:
            rows.append({"case": f"{model}:{fault or 'clean'}", "error": f"skipped: the {args.budget:g} s budget is spent"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        try:
            rows.append(one(model, fault, args, args.out / "dumps"))
        except Exception as e:  # one case failing must not lose the others' numbers
            rows.append({"case": f"{model}:{fault or 'clean'}", "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(rows[-1])[:400], flush=True)
    ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
    rep = {"weights": args.weights, "device": args.device, "dtype": args.dtype, "repeat": args.repeat, "cases": rows,
           "ratio_median": statistics.median(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None}
    (args.out / "diagnosis_cost.json").write_text(json.dumps(rep, indent=1) + "\n")
    lines = [f"{'case':<42} {'compare s':>10} {'diagnose s':>11} {'replay s':>9} {'ratio':>7}  diagnosis"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<42} ERROR {r['error']}")
            continue
        d = r["diagnosis"][0][:90] if r["diagnosis"] else ("no simple explanation" if r["no_simple_explanation"] else "-")
        lines.append(f"{r['case']:<42} {r['compare_s']:>10.4f} {r['diagnose_s']:>11.4f} {r['replay_s']:>9.4f} "
                     f"{r['ratio']:>7.2f}  {d}")
    lines.append(f"ratio (diagnose + replay) / compare: median {rep['ratio_median']}, max {rep['ratio_max']}")
    (args.out / "diagnosis_cost.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
