"""The route a user meets first, measured for both models: `tensordiff check` with no --dtype (the
model's official dtype: the semantic pass, then the numeric pass judged against the oracle's own
floor; local error in each pass that diverges or holds a near-tie flip's cascade).

- the clean engine on photographs x chunk sizes, with a prompt and `--decode`: every case must
  pass; the table gives the clean engine's worst ratio to the floor per boundary over them;
- every planted fault of both fault tables, each on a case that takes its route: the pass that
  caught it, the boundary named, its ratio to the floor there (numeric pass), each pass's local
  origin; caught means named at its own boundary, by a pass end to end or by local error, with
  every local origin agreeing.

    python bench/default_route.py [--device cuda] [--models deepseek-v4.1-flash,qwen3-vl]
        [--images astronaut,chelsea,coffee,rocket] [--chunks 1,5,64,none] [--decode 4]
        [--faults all|none|NAME,...] [--no-clean] [--workers N] [--budget-s S] [--json OUT.json]

Each case is `pipeline.check` (what `tensordiff check` runs), in this process or, with
`--workers`, one process per case (this script with `--case`), the oracle dumps shared through
TENSORDIFF_CACHE. A case not started within `--budget-s` is listed as skipped. Exit 0 when every
clean case passed and every fault was caught at its boundary, 1 otherwise.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MODELS = ("deepseek-v4.1-flash", "qwen3-vl")
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
PROMPT = "Describe <image>."
TWO_IMAGES = "Compare <image> with <image>."
FAULT_CHUNK = 5  # a chunked prefill whose boundaries cut the image span (the chunk faults' route)


# ----------------------------------------------------------------------------- the cases

def pictures(names, out: Path) -> dict[str, Path]:
    """scikit-image photographs as files, the bundled picture as `default`, and `rounding` (coffee
    at 112x80: 80 / 32 = 2.5 rounds to 64 and ceils to 96 inside Qwen3-VL's tiny pixel budget, the
    side its resize fault needs)."""
    from PIL import Image

    from tensordiff.pipeline.inputs import default_image_path

    out.mkdir(parents=True, exist_ok=True)
    paths = {"default": default_image_path()}
    for n in names:
        import skimage.data

        p = out / f"{n}.png"
        if not p.exists():
            Image.fromarray(getattr(skimage.data, n)()).convert("RGB").save(p)
        paths[n] = p
    rounding = out / "rounding.png"
    if not rounding.exists():
        import skimage.data

        Image.fromarray(skimage.data.coffee()).resize((112, 80), Image.Resampling.LANCZOS).save(rounding)
    paths["rounding"] = rounding
    return paths


def fault_case(model: str, fault, pics: dict[str, Path], decode: int, device: str) -> dict:
    """The case that carries `fault` on the default route: the bundled picture, with a prompt and
    the decode steps where the fault lives in the language path (a chunked prefill whose chunks cut
    the image span where it needs one, else chunks of 64); two images, the quantised checkpoint or
    another picture where its needs say so."""
    from tensordiff.pipeline.faults import CHUNK, LANGUAGE, SEVERAL_IMAGES

    text = fault.needs_text
    language = LANGUAGE in fault.requirements or "--decode" in text or "rope_deltas" in text
    case = {"model": model, "fault": fault.name, "boundary": fault.boundary, "images": [str(pics["default"])],
            "prompt": PROMPT if language else None, "chunk": (FAULT_CHUNK if CHUNK in fault.requirements else 64)
            if language else None, "decode": decode if language else 0, "device": device,
            "weights": "synthetic:tiny"}
    if SEVERAL_IMAGES in fault.requirements:
        case.update(images=[str(pics["default"]), str(pics.get("astronaut", pics["default"]))], prompt=TWO_IMAGES)
    if "tiny-fp8" in text:
        case["weights"] = "synthetic:tiny-fp8"
    if "not the bundled" in text:  # a picture side the bundled one lacks
        case["images"] = [str(pics["rounding"])]
    return case


def plan(a) -> list[dict]:
    from tensordiff.pipeline import registry

    pics = pictures([n for n in a.images if n != "default"], Path(a.work) / "images")
    cases = []
    # every picture of every model at the first chunk size before any at the next: cases that run
    # at once compute distinct oracle dumps, the later chunk sizes find them in the cache
    for chunk in a.chunks if a.clean else ():
        for model in a.models:
            for name in a.images:
                cases.append({"model": model, "fault": None, "images": [str(pics[name])], "picture": name,
                              "prompt": PROMPT, "chunk": chunk, "decode": a.decode, "device": a.device,
                              "weights": "synthetic:tiny"})
    for model in a.models:
        for f in registry.adapter(model).faults:
            if a.faults == ["all"] or f.name in a.faults:
                cases.append(fault_case(model, f, pics, a.decode, a.device))
    return cases


def run_one(case: dict) -> dict:
    """One case through `pipeline.check`; its row (JSON-safe)."""
    from tensordiff.errors import BadInput
    from tensordiff.pipeline.case import CaseSpec, check

    imgs = [Path(p) for p in case["images"]]
    spec = CaseSpec(case["model"], image=imgs[0], more_images=tuple(imgs[1:]), weights=case["weights"],
                    device=case["device"], fault=case["fault"], prompt=case["prompt"], chunk=case["chunk"],
                    decode=case["decode"])
    t0 = time.perf_counter()
    try:
        c = check(spec)
    except BadInput as e:
        return {**case, "error": str(e), "seconds": time.perf_counter() - t0}
    return {**case, **summary(c, case.get("boundary")), "seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- one case's facts

def _x(t) -> float | None:
    """A numeric-pass tensor's worst multiple of its floor: the largest of its tensor-wide RMSE,
    its max row RMSE, its worst row against that row's own floor (a decode step: its family row)."""
    m = t.metrics if t.mode == "floor" else None
    if not m or m.get("exact_floor"):
        return None
    xs = [m["ratios"]["rmse"], m["ratios"]["row"]]
    xs += [w["x_floor"] for w in m.get("worst_rows") or []][:1]
    if "family" in m:
        xs.append(m["family"]["x_floor"])
    xs = [float(x) for x in xs if isinstance(x, (int, float))]
    return max(xs) if xs else None


def summary(c, boundary: str | None = None) -> dict:
    """What the tables read from a CaseResult: each pass's verdict, earliest boundaries and local
    origin, the numeric pass's worst ratio per boundary, and (for a fault) the ratio at its boundary."""
    passes = {c.passes[0]: c.report} | ({"numeric": c.numeric} if c.numeric is not None else {})
    if c.passes == ("numeric",):
        passes = {"numeric": c.report}
    local = {c.passes[0]: c.local} | ({"numeric": c.local_numeric} if c.numeric is not None else {})
    if c.passes == ("numeric",):
        local = {"numeric": c.local}
    num = passes.get("numeric")
    ratios, cascade = {}, {}
    for b in (num.boundaries if num is not None else []):
        xs = [x for t in b.tensors if (x := _x(t)) is not None]
        if xs:
            (cascade if b.status == "cascade" else ratios)[b.name] = max(xs)
    out = {"passed": c.passed, "passes": list(c.passes),
           "verdicts": {p: r.verdict for p, r in passes.items()},
           "earliest": {p: r.earliest for p, r in passes.items()},
           "local_origin": {p: (lr.origin if lr is not None else None) for p, lr in local.items()},
           "local_ran": {p: lr is not None for p, lr in local.items()},
           "undeclared": {p: [r.boundary for r in lr.undeclared] for p, lr in local.items() if lr is not None},
           "tokens": {p: r.generated for p, r in passes.items() if r.generated},
           "numeric_x": ratios, "numeric_cascade_x": cascade}
    if boundary is not None and num is not None:
        at = [b for b in num.boundaries if fnmatch.fnmatchcase(b.name, boundary)]
        xs = [x for b in at for t in b.tensors if (x := _x(t)) is not None]
        out["x_at_boundary"] = max(xs) if xs else None
    return out


def caught(row: dict) -> tuple[bool, str, list[str]]:
    """(caught at its boundary with every local origin agreeing?, the passes that named it, why not)."""
    pat = row["boundary"]
    named = [p for p, e in row.get("earliest", {}).items() if any(fnmatch.fnmatchcase(n, pat) for n in e)]
    by_local = [p for p, o in row.get("local_origin", {}).items() if o and fnmatch.fnmatchcase(o, pat)]
    why = []
    if row.get("error") or row.get("skipped"):
        why.append(row.get("error") or f"skipped ({row['skipped']})")
    for p, e in row.get("earliest", {}).items():
        if row["verdicts"][p] == "diverged" and not any(fnmatch.fnmatchcase(n, pat) for n in e):
            why.append(f"{p} names {', '.join(e) or 'no root'}")
    for p, o in row.get("local_origin", {}).items():
        if o and not fnmatch.fnmatchcase(o, pat):
            why.append(f"{p} local origin {o}")
        if p in named and row.get("local_ran", {}).get(p) and not o:
            why.append(f"{p} named it but its local error has no origin")
    by = named or [f"{p} local error" for p in by_local]
    return bool(by) and not why, "+".join(by) or "none", why


# ----------------------------------------------------------------------------- tables

def _g(x) -> str:
    return "-" if x is None else ("inf" if isinstance(x, float) and math.isinf(x) else f"{x:.3g}")


def tables(rows: list[dict]) -> tuple[str, dict]:
    """The fault table and the clean table (text), and the summary (JSON)."""
    lines = []
    clean = [r for r in rows if r.get("fault") is None]
    faults = [r for r in rows if r.get("fault") is not None]
    ran = [r for r in clean if "passed" in r]
    lines.append(f"clean engine: {sum(r['passed'] for r in ran)} of {len(ran)} cases pass"
                 + (f" ({len(clean) - len(ran)} skipped or errors)" if len(ran) < len(clean) else ""))
    for r in ran:
        if not r["passed"]:
            lines.append(f"  FAIL {r['model']} {r['picture']} chunk {r['chunk']}: earliest {r['earliest']}, "
                         f"local {r['local_origin']}")
    worst: dict = {}
    for r in ran:
        for b, x in r["numeric_x"].items():
            w = worst.setdefault((r["model"], b), {"x": 0.0, "n": 0, "cascade": 0, "cascade_x": 0.0})
            w["x"], w["n"] = max(w["x"], x), w["n"] + 1
        for b, x in r["numeric_cascade_x"].items():
            w = worst.setdefault((r["model"], b), {"x": 0.0, "n": 0, "cascade": 0, "cascade_x": 0.0})
            w["cascade"], w["cascade_x"] = w["cascade"] + 1, max(w["cascade_x"], x)
    lines += ["", "clean engine, numeric pass: worst ratio to the floor per boundary over the photographs "
                  "(max of RMSE, max row, worst row against its own floor; cascade: after a near-tie flip, "
                  "judged by local error)",
              f"{'model':<20} {'boundary':<18} {'cases':>5} {'worst x floor':>13} {'cascades':>8} {'cascade x':>9}"]
    for (m, b), w in worst.items():
        lines.append(f"{m:<20} {b:<18} {w['n']:>5} {_g(w['x'] if w['n'] else None):>13} {w['cascade']:>8} "
                     f"{_g(w['cascade_x'] if w['cascade'] else None):>9}")
    lines += ["", "faults (default route; caught = named at its boundary, every local origin agreeing)",
              f"{'model':<20} {'fault':<30} {'boundary':<17} {'caught by':<22} {'x floor':>8} "
              f"{'semantic local':<17} {'numeric local':<17} ok"]
    fault_out = []
    for r in faults:
        ok, by, why = caught(r)
        lo = r.get("local_origin", {})
        lines.append(f"{r['model']:<20} {r['fault']:<30} {r['boundary']:<17} {by:<22} {_g(r.get('x_at_boundary')):>8} "
                     f"{lo.get('semantic') or '-':<17} {lo.get('numeric') or '-':<17} "
                     f"{'yes' if ok else 'NO: ' + '; '.join(why)}")
        fault_out.append({"model": r["model"], "fault": r["fault"], "boundary": r["boundary"], "caught_by": by,
                          "x_at_boundary": r.get("x_at_boundary"), "local_origin": lo, "ok": ok, "why": why})
    out = {"clean_pass": f"{sum(r['passed'] for r in ran)} of {len(ran)}", "clean_cases": len(clean),
           "worst": [{"model": m, "boundary": b, **w} for (m, b), w in worst.items()], "faults": fault_out,
           "all_ok": bool(ran or fault_out) and len(ran) == len(clean) and all(r["passed"] for r in ran)
           and all(f["ok"] for f in fault_out)}
    return "\n".join(lines), out


# ----------------------------------------------------------------------------- main

def parse(argv):
    p = argparse.ArgumentParser(prog="bench/default_route.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--images", default=",".join(PHOTOS), help="scikit-image photograph names (or default)")
    p.add_argument("--chunks", default="1,5,64,none", help="prefill chunk sizes; none = one chunk")
    p.add_argument("--decode", type=int, default=4)
    p.add_argument("--faults", default="all", help="all, none, or a comma-separated list of fault names")
    p.add_argument("--no-clean", dest="clean", action="store_false", help="run the faults only")
    p.add_argument("--workers", type=int, default=1, help="cases at once, one process each (1: in this process)")
    p.add_argument("--budget-s", type=float, default=None, help="start no case after this many seconds")
    p.add_argument("--work", default=None, help="where the pictures go (default: a temporary directory)")
    p.add_argument("--json", default=None, help="write every case's row and the summary here")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # a worker: one case as JSON, its row out
    a = p.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    a.images = [m for m in a.images.split(",") if m]
    a.chunks = [None if c == "none" else int(c) for c in a.chunks.split(",") if c]
    a.faults = [] if a.faults == "none" else a.faults.split(",")
    return a


def _in_worker(case: dict) -> dict:
    p = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {**case, "error": f"worker exit {p.returncode}: {p.stderr.strip()[-400:]}"}


def main(argv=None) -> int:
    a = parse(argv)
    if a.case is not None:
        print(json.dumps(run_one(json.loads(a.case)), default=str))
        return 0
    with tempfile.TemporaryDirectory(prefix="default-route-") as tmp:
        a.work = a.work or tmp
        cases = plan(a)
        t0 = time.perf_counter()
        rows: list[dict] = []

        def go(case):
            if a.budget_s is not None and time.perf_counter() - t0 > a.budget_s:
                return {**case, "skipped": "time budget"}
            row = run_one(case) if a.workers <= 1 else _in_worker(case)
            tag = f"{case['model']} {case.get('fault') or 'clean ' + case.get('picture', '')} chunk {case['chunk']}"
            print(f"[{time.perf_counter() - t0:7.1f} s] {tag}: "
                  f"{'error ' + row['error'] if 'error' in row else ('pass' if row['passed'] else 'FAIL')}",
                  file=sys.stderr, flush=True)
            return row

        if a.workers <= 1:
            rows = [go(c) for c in cases]
        else:
            with ThreadPoolExecutor(a.workers) as ex:
                rows = list(ex.map(go, cases))
        text, out = tables(rows)
        out.update(device=a.device, seconds=round(time.perf_counter() - t0, 1), decode=a.decode,
                   chunks=a.chunks, images=a.images, models=a.models)
        print(text)
        print(f"\n{out['seconds']} s on {a.device}; {'ALL OK' if out['all_ok'] else 'NOT ALL OK'}")
        if a.json:
            Path(a.json).write_text(json.dumps({"summary": out, "cases": rows}, indent=1, default=str) + "\n")
    return 0 if out["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
