"""The fp32 re-check of the Qwen3-VL logits false alarm (issue 14): synthetic:full-2b in float32,
TF32 off, `tensordiff check` on chelsea and astronaut at prefill chunks 1, 16 and 64 with 2
decode steps. Every check must MATCH: the fp32 logits are now judged with atol in units of their
RMS (`tensordiff.judge.tolerance`, `atol_scale`), and every other boundary as before.

    python bench/qwen_full2b_fp32.py --out DIR [--weights synthetic:full-2b] [--device cuda] [--faults]

Writes DIR/qwen_full2b_fp32.json: per check its exit status, verdict, earliest boundaries, wall
time, and for `logits` / `logits.step.*` the metrics that decide (max|d|, outside count, cosine,
SQNR), the measured RMS and the effective atol, with max|d| / effective atol as the headroom. A
time budget skips the checks left, and says so.
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
sys.path.insert(0, str(ROOT / "bench"))

sys.path.insert(0, str(ROOT))

from qwen_language import PROMPT, photographs  # noqa: E402  (the same pictures and prompt)

from tensordiff.judge.tolerance import Tolerance  # noqa: E402

CHUNKS, DECODE, PICTURES = (1, 16, 64), 2, ("chelsea", "astronaut")
# --faults: planted faults and the boundary each must be named at (the fp32 false alarm at
# `logits` used to hide `decode-no-delta` behind it)
FAULTS = {"decode-no-delta": "logits.step.1", "logits-no-final-norm": "logits"}


def logits_rows(report: dict) -> dict:
    out = {}
    for b in report.get("boundaries", []):
        name = b.get("boundary") or b.get("name")
        if not (name == "logits" or str(name).startswith("logits.step.")):
            continue
        m, t = b["metrics"].get(name, {}), b["tolerance"].get(name, {})
        eff = Tolerance.from_dict(t).effective_atol if "atol" in t and "rtol" in t else None
        out[name] = {"status": b.get("status"), "max_abs": m.get("max_abs"), "mismatches": m.get("mismatches"),
                     "numel": m.get("numel"), "cosine": m.get("cosine"), "sqnr_db": m.get("sqnr_db"),
                     "atol": t.get("atol"), "atol_scale": t.get("atol_scale"), "rms_a": t.get("scale"),
                     "atol_effective": eff,
                     "headroom": (m["max_abs"] / eff) if eff and m.get("max_abs") is not None else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--weights", default="synthetic:full-2b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds; checks left after it are skipped")
    ap.add_argument("--faults", action="store_true", help="also the planted faults of FAULTS on the first picture")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pics, source = photographs(args.out)
    chosen = [p for p in pics if p.stem in PICTURES] or pics[:2]
    env = {**os.environ, "NVIDIA_TF32_OVERRIDE": "0"}
    plan = [(pic, chunk, None) for pic in chosen for chunk in CHUNKS]
    if args.faults:  # each must still be named at its own boundary under the scaled atol
        plan += [(chosen[0], 16, f) for f in FAULTS]
    t0, checks, last = time.monotonic(), [], 0.0

    def write(done: bool) -> dict:
        ran = [c for c in checks if "rc" in c and not c.get("fault")]
        faults = [c for c in checks if c.get("fault")]
        summary = {"weights": args.weights, "device": args.device, "dtype": "float32",
                   "tf32": "off (NVIDIA_TF32_OVERRIDE=0)", "pictures": source, "prompt": PROMPT, "checks": checks,
                   "all_match": bool(ran) and len(ran) == len(plan) - len(faults) and all(
                       c.get("verdict") == "match" for c in ran),
                   "faults_named": all(c.get("named_at_boundary") for c in faults) if faults else None,
                   "complete": done, "seconds": round(time.monotonic() - t0, 1)}
        (args.out / "qwen_full2b_fp32.json").write_text(json.dumps(summary, indent=1))  # after every check
        return summary

    for pic, chunk, fault in plan:
        row = {"image": pic.name, "chunk": chunk, "decode": DECODE, "fault": fault}
        if time.monotonic() - t0 + last > args.budget:  # the next check would end past the budget
            row["skipped"] = f"time budget of {args.budget:.0f} s"
            checks.append(row)
            continue
        j = args.out / f"{pic.stem}-chunk{chunk}{'-' + fault if fault else ''}.json"
        cmd = [sys.executable, "-m", "tensordiff.commands.cli", "check", "qwen3-vl", "--weights", args.weights,
               "--device", args.device, "--dtype", "float32", "--image", str(pic), "--prompt", PROMPT,
               "--chunk", str(chunk), "--decode", str(DECODE), "--json", str(j)] + (["--fault", fault] if fault else [])
        s = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        last = time.monotonic() - s
        row.update(rc=p.returncode, seconds=round(last, 2), stdout_head=p.stdout.splitlines()[:3],
                   stderr_tail=p.stderr.splitlines()[-3:])
        if j.is_file():
            rep = json.loads(j.read_text())
            row.update(verdict=rep.get("verdict"), earliest=rep.get("earliest"), logits=logits_rows(rep))
            if fault:
                row["named_at_boundary"] = rep.get("earliest") == [FAULTS[fault]]
        print(json.dumps({k: row.get(k) for k in ("image", "chunk", "fault", "rc", "verdict", "earliest", "seconds")}),
              flush=True)
        checks.append(row)
        write(False)
    summary = write(True)
    ran = [c for c in checks if "rc" in c]
    print(f"all_match={summary['all_match']} faults_named={summary['faults_named']} "
          f"({len(ran)} of {len(checks)} checks ran, {summary['seconds']} s)")
    return 0 if summary["all_match"] and summary["faults_named"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
