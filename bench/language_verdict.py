"""The DeepSeek language verdict in bf16 through `check`'s default route (semantic + numeric pass),
measured: clean checks over photographs x chunk sizes with `--decode 4`, the language faults each
at its boundary, and optionally a `--layers` subset at the released dimensions. The cases run in
`--workers` processes at once (sharing the GPU: the tiny config is launch-bound, the language
oracle runs on the CPU), the oracle dumps shared through TENSORDIFF_CACHE (the fp32 reference and
the bf16 floor run once per picture: every chunk size of a picture reuses them); each case is
exactly what `tensordiff check` runs (`pipeline.check`), its exit code `CaseResult.exit_code`.

    python bench/language_verdict.py OUTDIR [--device cuda] [--cases all|quick|smoke] [--workers 8]
                                            [--budget-s 420] [--ckpt DIR]

Writes OUTDIR/images/ (the pictures), OUTDIR/cases/<name>.json (each case as `check --json` plus
the numeric report), OUTDIR/summary.json (rewritten after every case, so a run cut short keeps
what it finished): per case the exit code, its seconds, each pass's verdict, the local error's
origin, benign flips and cascade boundaries; per boundary of the clean cases the floor
(relative RMSE) and the clean engine's RMSE / row / cosine ratios (min / median / max over cases);
per fault its named boundary, where each pass and local error put it, and its ratios there.
OUTDIR/summary.md is the same as tables.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

MODEL = "deepseek-v4.1-flash"
PROMPT = "Describe <image>."
PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
import tensordiff.models.deepseek_v41_flash.faults as D  # noqa: E402  (the fault names, by constant)

# every language fault of the table, each on a case whose geometry and weights exercise it
# (chunk, weights, prompt, further images); the decode one last (the smoke run's fault)
FAULT_CASES = {
    D.ROUTER_TEXT_BIAS_FOR_IMAGES: {}, D.ROUTER_BIASED_WEIGHTS: {}, D.ENGRAM_NGRAM_ACROSS_IMAGE: {},
    D.OVERLAY_CHUNK_SHIFT: {"chunk": 5},
    D.IMAGE_SPAN_UNEXPANDED: {"prompt": "Compare <image> with <image>.", "second_image": True},
    D.FP8_SCALE_IGNORED: {"weights": "synthetic:tiny-fp8"}, D.FP8_SCALE_TRANSPOSED: {"weights": "synthetic:tiny-fp8"},
    D.FP4_NIBBLES_SWAPPED: {"weights": "synthetic:tiny-fp8"}, D.ENGRAM_SCALE_IGNORED: {"weights": "synthetic:tiny-fp8"},
    D.WO_A_SCALE_DROPPED: {"weights": "synthetic:tiny-fp8"}, D.WO_A_BLOCK_128: {"weights": "synthetic:tiny-fp8"},
    D.FP4_INT8_SIGN_EXTENDED: {"weights": "synthetic:tiny-fp8"},
    D.EMBED_LAST_ROW_SCALE: {}, D.ROUTER_LAST_ROW_RENORM: {}, D.DECODE_ROPE_OFF_BY_ONE: {},
    D.DECODE_ENGRAM_WINDOW_RESET: {},
}
FAULTS = tuple(FAULT_CASES)


def pictures(out: Path, quick: bool) -> list[Path]:
    """scikit-image's photographs, JPEG and PNG alternately, plus a very wide and a very tall crop
    (of coffee and of astronaut); the bundled picture stands in where scikit-image is missing."""
    from PIL import Image

    from tensordiff.pipeline.inputs import default_image_path

    out.mkdir(parents=True, exist_ok=True)
    pics: dict[str, Image.Image] = {}
    try:
        import skimage.data as d

        for name in PHOTOS:
            pics[name] = Image.fromarray(getattr(d, name)()).convert("RGB")
    except Exception as e:  # noqa: BLE001  (no scikit-image, or a data file it cannot fetch)
        print(f"scikit-image unavailable ({type(e).__name__}: {e}); the bundled picture stands in", file=sys.stderr)
        pics = {"bundled": Image.open(default_image_path()).convert("RGB")}
    paths = []
    for i, (name, im) in enumerate(pics.items()):
        p = out / f"{name}.{'jpg' if i % 2 == 0 else 'png'}"
        im.save(p, quality=90) if p.suffix == ".jpg" else im.save(p)
        paths.append(p)
    first = next(iter(pics.values()))
    wide_src, tall_src = pics.get("coffee", first), pics.get("astronaut", first)
    w, h = wide_src.size
    wide_src.crop((0, h // 2 - h // 12, w, h // 2 + h // 12)).save(out / "wide.jpg", quality=90)
    w, h = tall_src.size
    tall_src.crop((w // 2 - w // 14, 0, w // 2 + w // 14, h)).save(out / "tall.png")
    paths += [out / "wide.jpg", out / "tall.png"]
    return paths[:1] + paths[-2:-1] if quick else paths


def boundary_rows(report: dict | None) -> dict[str, dict]:
    """Per boundary of a numeric report: its status and, per floor-judged tensor, the floor's
    relative RMSE and the engine's ratios."""
    rows = {}
    for b in (report or {}).get("boundaries", []):
        for t in b.get("tensors", []):
            m = t.get("metrics") or {}
            if t.get("mode") != "floor" or not isinstance(m.get("ratios"), dict):
                continue
            rows.setdefault(b["name"], {"status": b["status"], "floor_relative": m["floor"].get("relative"),
                                        **{f"x_{k}": v for k, v in m["ratios"].items()},
                                        "worst_row_x": (t.get("worst") or {}).get("x_floor")})
    return rows


def flips(report: dict | None) -> list[dict]:
    out = []
    for b in (report or {}).get("boundaries", []):
        for t in b.get("tensors", []):
            for f in ((t.get("metrics") or {}).get("ties") or {}).get("flips", []):
                out.append({"tensor": t["name"], **{k: f.get(k) for k in ("row", "margin", "floor", "benign")}})
    return out


def run_case(name: str, spec, out: Path) -> dict:
    from tensordiff.errors import BadInput
    from tensordiff.pipeline.case import check

    t0 = time.perf_counter()
    try:
        case = check(spec)
    except BadInput as e:
        return {"case": name, "exit": 2, "error": str(e).splitlines()[0], "seconds": time.perf_counter() - t0}
    data = case.as_json()
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    rep, num = data["report"], data["numeric"]
    row = {"case": name, "exit": case.exit_code, "seconds": round(time.perf_counter() - t0, 2),
           "passes": data["passes"], "image": Path(spec.image).name if spec.image else None, "chunk": spec.chunk,
           "fault": spec.fault, "layers": spec.layers,
           "verdicts": {data["passes"][0]: rep["verdict"], **({"numeric": num["verdict"]} if num else {})},
           "earliest": {data["passes"][0]: rep.get("earliest"), **({"numeric": num.get("earliest")} if num else {})},
           "local_origin": (data["local_error"] or {}).get("origin") if data["local_error"] else "not run",
           "numeric_local_origin": (data["local_error_numeric"] or {}).get("origin")
           if data.get("local_error_numeric") else "not run",
           "benign": {p: [b["name"] for b in r["boundaries"] if b["status"] == "benign"]
                      for p, r in ((data["passes"][0], rep), ("numeric", num)) if r},
           "cascade": {p: [b["name"] for b in r["boundaries"] if b["status"] == "cascade"]
                       for p, r in ((data["passes"][0], rep), ("numeric", num)) if r},
           "flips": flips(num) + flips(rep), "numeric_boundaries": boundary_rows(num)}
    print(f"{name}: exit {row['exit']} {row['verdicts']} local {row['local_origin']} numeric local "
          f"{row['numeric_local_origin']} ({row['seconds']} s)", flush=True)
    return row


def spread(values: list[float]) -> dict:
    v = sorted(x for x in values if isinstance(x, (int, float)))
    return {"min": v[0], "median": statistics.median(v), "max": v[-1], "n": len(v)} if v else {}


def _worker_init(threads: int) -> None:
    """A worker's torch threads: the host's cores shared among the workers (no oversubscription)."""
    import torch

    torch.set_num_threads(max(1, threads))


def plan_cases(a, images: list[Path], spec) -> list[tuple[str, object]]:
    """The cases in the order they start: every picture at chunk 64 (distinct pictures first, so
    the workers fill the oracle cache in parallel), the faults, the direct route, then the other
    chunk sizes (their oracle dumps cached by then); `smoke` is one picture and one fault."""
    readme = images[0]

    def fault_case(f):
        kw = dict(FAULT_CASES[f])
        more = (images[-1],) if kw.pop("second_image", False) else ()
        return f"fault-{f}", spec(readme, kw.pop("chunk", 64), f, more_images=more, **kw)

    if a.cases == "smoke":
        return [(f"clean-{readme.stem}-c64", spec(readme, 64)), fault_case(FAULTS[-1])]
    plan: list[tuple[str, object]] = []
    images = images[:1] if a.only_ckpt else images
    if not a.only_ckpt:
        chunks = (64, None) if a.cases == "quick" else (64, None, 5, 1)
        plan += [(f"clean-{p.stem}-c64", spec(p, 64)) for p in images]
        plan += [fault_case(f) for f in FAULTS]
        # the quantised checkpoint's own clean case (its faults' reference run)
        plan.append((f"clean-{readme.stem}-c64-fp8", spec(readme, 64, weights="synthetic:tiny-fp8")))
        # the old route for comparison (`check --passes direct --oracle-dtype float32`, tensor-wide
        # bf16 defaults): on the H200 it exited 1 on coffee and a very wide crop at hidden.0
        plan += [(f"direct-{p.stem}-c64", spec(p, 64, passes=("direct",), oracle_dtype="float32"))
                 for p in images if p.stem in ("coffee", "wide")]
        plan += [(f"clean-{p.stem}-c{c or 'none'}", spec(p, c)) for c in chunks[1:] for p in images]
    if a.ckpt:
        for f in (None, "router-biased-weights"):
            plan.append((f"real-dims-layers{a.layers}-{f or 'clean'}",
                         spec(readme, 64, f, weights=a.ckpt, layers=a.layers, passes=("direct",),
                              oracle_dtype="float32")))
    return plan


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--weights", default="synthetic:tiny")
    ap.add_argument("--cases", choices=("all", "quick", "smoke"), default="all",
                    help="all: 10 pictures x chunks 64, none, 5, 1 + the faults; quick: two pictures, two chunk "
                         "sizes, the faults; smoke: one picture and one fault (a CPU check of the script)")
    ap.add_argument("--quick", action="store_true", help="the same as --cases quick")
    ap.add_argument("--workers", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                    help="cases running at once, each in its own process")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new case after this many seconds")
    ap.add_argument("--ckpt", default=None, help="a real-dims checkpoint (bench/real_dims_layers.py --work): "
                                                 "also run --layers LAYERS on it, clean and with a router fault")
    ap.add_argument("--layers", default="2")
    ap.add_argument("--only-ckpt", action="store_true", help="only the --ckpt cases (REAL_DIMS=1)")
    a = ap.parse_args()
    if a.quick:
        a.cases = "quick"
    from tensordiff.pipeline.case import CaseSpec, default_passes

    start = time.perf_counter()
    cases_dir = a.out / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    images = pictures(a.out / "images", a.cases != "all")
    passes = default_passes("bfloat16")  # what `check --dtype bfloat16` runs: semantic + numeric

    def spec(image, chunk, fault=None, **kw):
        return CaseSpec(MODEL, image=image, weights=kw.pop("weights", a.weights), device=a.device, dtype="bfloat16",
                        prompt=kw.pop("prompt", PROMPT), chunk=chunk, decode=4, fault=fault,
                        passes=kw.pop("passes", passes), **kw)

    plan = plan_cases(a, images, spec)
    summary = {"device": a.device, "weights": a.weights, "passes": list(passes), "workers": a.workers,
               "cases": [], "seconds": 0.0}
    rows: dict[str, dict] = {}
    threads = max(1, (os.cpu_count() or 2) // max(1, a.workers))
    import multiprocessing

    with ProcessPoolExecutor(max_workers=max(1, a.workers), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init, initargs=(threads,)) as pool:
        todo, running = list(plan), {}
        while todo or running:
            while todo and len(running) < max(1, a.workers):
                name, s = todo.pop(0)
                if time.perf_counter() - start > a.budget_s:
                    rows[name] = {"case": name, "exit": None, "skipped": "time budget"}
                    print(f"{name}: skipped (time budget)", flush=True)
                    continue
                running[pool.submit(run_case, name, s, cases_dir)] = name
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                name = running.pop(fut)
                try:
                    rows[name] = fut.result()
                except Exception as e:  # noqa: BLE001  (one broken case must not lose the others)
                    rows[name] = {"case": name, "exit": None, "error": f"{type(e).__name__}: {e}"}
                    print(f"{name}: ERROR {type(e).__name__}: {e}", flush=True)
            # the summary after every case, in plan order: a run cut short keeps what it finished
            summary["cases"] = [rows[n] for n, _ in plan if n in rows]
            summary["seconds"] = round(time.perf_counter() - start, 1)
            summarise(summary, a.out, quiet=True)
    summary["cases"] = [rows.get(n, {"case": n, "exit": None, "skipped": "not run"}) for n, _ in plan]
    summary["seconds"] = round(time.perf_counter() - start, 1)
    summarise(summary, a.out)
    return 0


def summarise(summary: dict, out: Path, quiet: bool = False) -> None:
    """summary.json and summary.md from the cases' rows (`summary["cases"]`); `quiet`: written
    only (the interim summaries of a running bench)."""
    rows = summary["cases"]
    clean = [r for r in rows if r["case"].startswith("clean-") and r.get("exit") is not None]
    # the ratios of boundaries the floor judged; a flip's cascade (judged by local error) apart
    table: dict[str, dict] = {}
    for r in clean:
        for b, m in r.get("numeric_boundaries", {}).items():
            t = table.setdefault(b, {"floor_relative": [], "x_rmse": [], "x_row": [], "x_cosine": [],
                                     "worst_row_x": [], "cascade_x_rmse": []})
            t["floor_relative"].append(m.get("floor_relative"))  # the oracle's own: whatever the engine did
            if m["status"] == "cascade":
                t["cascade_x_rmse"].append(m.get("x_rmse"))
                continue
            # worst_row_x: the worst row (block) against its floor; a decode step's is the one it is
            # judged by, against its row floor (`floor.row_family`)
            for k in ("x_rmse", "x_row", "x_cosine", "worst_row_x"):
                t[k].append(m.get(k))
    summary["clean_numeric_table"] = {b: {k: spread(v) for k, v in t.items()} for b, t in table.items()}
    from tensordiff.models.deepseek_v41_flash.faults import FAULTS as TABLE

    named = {f.name: f.boundary for f in TABLE}
    summary["faults"] = []
    for r in rows:
        if r.get("fault") and r.get("exit") is not None:
            want = named[r["fault"]]
            summary["faults"].append({"case": r["case"], "fault": r["fault"], "boundary": want, "exit": r["exit"],
                                      "earliest": r.get("earliest"), "local_origin": r.get("local_origin"),
                                      "caught_at_boundary": any(want in (e or []) for e in (r.get("earliest") or {}).values())
                                      or want in (r.get("local_origin"), r.get("numeric_local_origin")),
                                      "numeric_local_origin": r.get("numeric_local_origin"),
                                      "numeric_at_boundary": r.get("numeric_boundaries", {}).get(want)})
    summary["clean_exit_0"] = f"{sum(r['exit'] == 0 for r in clean)} of {len(clean)}"
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    md = ["| case | exit | verdicts | local origin (first pass / numeric) | benign (numeric) | cascade (numeric) | s |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("exit") is None:
            md.append(f"| {r['case']} | skipped | | | | | |")
            continue
        md.append(f"| {r['case']} | {r['exit']} | {r.get('verdicts', r.get('error'))} | {r.get('local_origin')} / "
                  f"{r.get('numeric_local_origin')} | "
                  f"{', '.join((r.get('benign') or {}).get('numeric', [])) or '-'} | "
                  f"{len((r.get('cascade') or {}).get('numeric', []))} | {r.get('seconds')} |")
    md += ["", "clean cases, boundaries the floor judged (a near-tie flip's cascade apart: its count and max):", "",
           "| boundary | floor rel. RMSE (median) | x RMSE min / med / max | x row min / med / max | "
           "x cos min / med / max | worst row x its floor, max | cascade: n, max x RMSE |",
           "|---|---|---|---|---|---|---|"]
    for b, t in summary["clean_numeric_table"].items():
        f = lambda s: f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}" if s else "-"  # noqa: E731
        fl, cas = t["floor_relative"], t["cascade_x_rmse"]
        floor = f"{fl['median']:.3g}" if fl else "-"
        cascade = f"{cas['n']}, {cas['max']:.3g}" if cas else "-"
        wr = t.get("worst_row_x") or {}
        worst = f"{wr['max']:.3f}" if wr else "-"
        md.append(f"| {b} | {floor} | {f(t['x_rmse'])} | {f(t['x_row'])} | {f(t['x_cosine'])} | {worst} | {cascade} |")
    md += ["", "| fault | boundary | exit | earliest (per pass) | local origin (first pass / numeric) | "
           "caught at its boundary |", "|---|---|---|---|---|---|"]
    for f in summary["faults"]:
        md.append(f"| {f['fault']} | {f['boundary']} | {f['exit']} | {f['earliest']} | {f['local_origin']} / "
                  f"{f['numeric_local_origin']} | {f['caught_at_boundary']} |")
    (out / "summary.md").write_text("\n".join(md) + "\n")
    if quiet:
        return
    print("\n".join(md))
    print(f"clean cases exiting 0: {summary['clean_exit_0']}; faults caught at their boundary: "
          f"{sum(f['caught_at_boundary'] for f in summary['faults'])} of {len(summary['faults'])}; "
          f"{summary['seconds']} s")


if __name__ == "__main__":
    sys.exit(main())
