"""Every named fault through the gate's default bf16 route (semantic + numeric pass, local error),
and the clean engine on the same cases: is every named fault caught at its boundary in at least
one of the two passes, and do local error and end to end agree on every fault's origin?

    python bench/fault_matrix.py OUTDIR [--device cuda] [--vision-weights synthetic:full]
                                        [--workers 6] [--only NAME,...] [--budget-s 420]

Per model it writes a few gate blocks (the vision path on images that reach every geometry rule;
the language backbone with a prompt, a small prefill chunk and decode steps; two images in one
prompt; DeepSeek's quantised checkpoint) and, per fault, a gate file holding only the blocks that
can carry it (the gate's own refusal rule decides; a fault that needs a quantised checkpoint runs
on `synthetic:tiny-fp8` only). Each gate runs as its own `tensordiff gate --fault F --json`
process, several at once. Per fault: the gate's exit code, each pass's verdict and earliest
boundaries, both local errors' origins, whether the named boundary was hit (`caught`) and whether
every origin found (end to end and local) is that boundary (`agree`). The clean blocks must exit 0.

Writes OUTDIR/fault_matrix.json, OUTDIR/fault_matrix.md and OUTDIR/gates/<name>.{toml,json,txt}.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEEPSEEK, QWEN = "deepseek-v4.1-flash", "qwen3-vl"
GATE_IMAGES = ROOT / "gates" / "images"
# faults whose route is a quantised checkpoint: their need is a property of the weights, which the
# refusal rule cannot check from the request, so the bench routes them itself
QUANTISED = {"fp8-scale-ignored", "fp8-scale-transposed", "fp4-nibbles-swapped", "engram-scale-ignored",
             "wo-a-scale-dropped", "wo-a-block-128", "fp4-int8-sign-extended"}


def side_picture(out: Path) -> Path:
    """The bundled picture at 1000x700: on the released Qwen3-VL processor (32-pixel cells, the
    normal branch of smart_resize) 1000 rounds to 992 but ceils to 1024, which the example gate's
    small PNGs reach only at the tiny config's cell size (their sizes fall in the min-pixels branch,
    which ceils by design, at the full one)."""
    from PIL import Image

    from tensordiff.pipeline.inputs import default_image_path

    p = out / "images" / "qwen-1000x700.png"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.open(default_image_path()).convert("RGB").resize((1000, 700), Image.BICUBIC).save(p)
    return p


def blocks(device: str, vision_weights: str, out: Path | None = None) -> dict[str, list[dict]]:
    """The gate blocks per model: name, the [[model]] table, and what kind of fault it carries."""
    default = "tensordiff:default"
    ds_images = [default, str(GATE_IMAGES / "deepseek-small-300x200.png"),
                 str(GATE_IMAGES / "deepseek-wide-3000x1000.png")]
    qw_images = [default, str(GATE_IMAGES / "qwen-tiny-40x60.png"), str(GATE_IMAGES / "qwen-odd-150x230.png")]
    if out is not None:
        qw_images.append(str(side_picture(out)))
    base = {"dtype": "bfloat16", "device": device, "backend": "torch", "local_error": True}
    return {
        DEEPSEEK: [
            {"block": "vision", "kind": "vision", "model": {**base, "weights": vision_weights, "images": ds_images}},
            # chunk 5: a chunk boundary precedes and cuts the image span (overlay faults need it)
            {"block": "language", "kind": "language",
             "model": {**base, "weights": "synthetic:tiny", "images": [default], "prompts": ["Describe <image>."],
                       "chunk": 5, "decode": 4}},
            {"block": "two-images", "kind": "language",
             "model": {**base, "weights": "synthetic:tiny", "images": [[default, ds_images[1]]],
                       "prompts": ["Compare <image> with <image>."], "chunk": 5, "decode": 2}},
            {"block": "quantised", "kind": "quantised",
             "model": {**base, "weights": "synthetic:tiny-fp8", "images": [default], "prompts": ["Describe <image>."],
                       "chunk": 64, "decode": 2}},
        ],
        QWEN: [
            {"block": "vision", "kind": "vision", "model": {**base, "weights": vision_weights, "images": qw_images}},
            # the example gate's language case: chunk 12 puts a boundary inside the image's pad range
            {"block": "language", "kind": "language",
             "model": {**base, "weights": "synthetic:tiny", "images": [default],
                       "prompts": ["Describe <image> in one sentence."], "chunk": 12, "decode": 2}},
        ],
    }


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def gate_text(name: str, model: str, tables: list[dict]) -> str:
    lines = ["[gate]", f"name = {json.dumps(name)}", "cache = true", ""]
    for t in tables:
        lines.append("[[model]]")
        lines.append(f"name = {json.dumps(model)}")
        lines += [f"{k} = {toml_value(v)}" for k, v in t.items()]
        lines.append("")
    return "\n".join(lines)


def carriers(adapter, fault, bl: list[dict]) -> list[dict]:
    """The blocks a fault runs in: the first language block that can carry it (the vision block
    for a vision fault), every block for nothing; the gate's refusal rule decides "can carry"."""
    from tensordiff.pipeline.case import carrier_dtype, default_passes
    from tensordiff.pipeline.options import fault_refusal

    def ok(b) -> bool:
        m = b["model"]
        imgs = m["images"][0]
        dtype = carrier_dtype(default_passes(m["dtype"], None), m["dtype"])
        return all(fault_refusal(adapter, fault.name, prompt=pr, chunk=m.get("chunk"), decode=m.get("decode", 0),
                                 dtype=dtype, images=len(imgs) if isinstance(imgs, list) else 1) is None
                   for pr in (m.get("prompts") or [None]))

    if fault.name in QUANTISED:
        return [b for b in bl if b["kind"] == "quantised"]
    vision = [b for b in bl if b["kind"] == "vision" and ok(b)]
    if vision:
        return vision
    lang = [b for b in bl if b["kind"] == "language" and ok(b)]
    return lang[:1]


def hits(name: str | None, pattern: str) -> bool:
    return bool(name) and fnmatch.fnmatchcase(name, pattern)


def summarise_case(c: dict) -> dict:
    """One gate case: each pass's verdict and earliest boundaries, both local errors' origins."""
    passes = c.get("passes") or []
    out = {"label": c.get("label"), "passed": c.get("passed"), "error": c.get("error"), "passes": {}}
    if passes and c.get("report"):
        out["passes"][passes[0]] = {"verdict": c["report"].get("verdict"), "earliest": c["report"].get("earliest")}
    if c.get("numeric"):
        out["passes"]["numeric"] = {"verdict": c["numeric"].get("verdict"), "earliest": c["numeric"].get("earliest")}
    for key in ("local_error", "local_error_numeric"):
        lr = c.get(key) or {}
        out[key] = lr.get("origin") if lr.get("available") else None
    return out


def run_one(job: dict, out: Path, timeout: int) -> dict:
    g = out / "gates"
    toml, js, txt = g / f"{job['name']}.toml", g / f"{job['name']}.json", g / f"{job['name']}.txt"
    toml.write_text(job["text"])
    cmd = [sys.executable, "-m", "tensordiff.commands.cli", "gate", str(toml), "--json", str(js), "-q"]
    if job.get("fault"):
        cmd += ["--fault", job["fault"]]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else str(e.stdout)
    txt.write_text(text)
    res = {**{k: job[k] for k in ("name", "model", "fault", "boundary", "blocks")}, "exit": rc,
           "seconds": round(time.perf_counter() - t0, 1), "cases": []}
    if js.exists():
        try:
            res["cases"] = [summarise_case(c) for c in json.loads(js.read_text()).get("cases", [])]
        except (ValueError, OSError) as e:
            res["json_error"] = str(e)
    if rc not in (0, 1):
        res["tail"] = text.strip().splitlines()[-3:]
    pat = job.get("boundary")
    if pat:  # a fault: where did each pass and each local error put it?
        found = [e for c in res["cases"] for p in c["passes"].values() if p["verdict"] != "match"
                 for e in (p["earliest"] or [])]
        local = [c[k] for c in res["cases"] for k in ("local_error", "local_error_numeric") if c[k]]
        res["end_to_end"] = sorted(set(found))
        res["local_origins"] = sorted(set(local))
        res["caught"] = rc == 1 and any(hits(x, pat) for x in found + local)
        res["caught_by"] = sorted({p for c in res["cases"] for p, v in c["passes"].items()
                                   if v["verdict"] != "match" and any(hits(e, pat) for e in v["earliest"] or [])}
                                  | {("local" if k == "local_error" else "numeric local") for c in res["cases"]
                                     for k in ("local_error", "local_error_numeric") if hits(c[k], pat)})
        res["agree"] = bool(found + local) and all(hits(x, pat) for x in found + local)
    else:  # a clean block: no false alarm
        res["clean_ok"] = rc == 0
    return res


def markdown(rows: list[dict]) -> str:
    lines = ["| model | fault | named boundary | blocks | exit | end to end | local origins | caught by | caught | agree | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("fault"):
            lines.append(f"| {r['model']} | {r['fault']} | `{r['boundary']}` | {', '.join(r['blocks'])} | {r['exit']} | "
                         f"{', '.join(r.get('end_to_end', [])) or '-'} | {', '.join(r.get('local_origins', [])) or '-'} | "
                         f"{', '.join(r.get('caught_by', [])) or '-'} | {'yes' if r.get('caught') else 'NO'} | "
                         f"{'yes' if r.get('agree') else 'no'} | {r['seconds']} |")
    lines += ["", "| model | clean block | exit | cases passed | s |", "|---|---|---|---|---|"]
    for r in rows:
        if not r.get("fault"):
            n = sum(1 for c in r["cases"] if c["passed"])
            lines.append(f"| {r['model']} | {', '.join(r['blocks'])} | {r['exit']} | {n}/{len(r['cases'])} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vision-weights", default="synthetic:full")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--only", default="", help="comma-separated fault names (and 'clean') to run")
    ap.add_argument("--models", default=f"{DEEPSEEK},{QWEN}")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new gate after this many seconds")
    ap.add_argument("--timeout-s", type=int, default=300)
    a = ap.parse_args(argv)
    from tensordiff.pipeline import registry

    out = a.out.resolve()
    (out / "gates").mkdir(parents=True, exist_ok=True)
    only = {x for x in a.only.split(",") if x}
    jobs = []
    for model, bl in blocks(a.device, a.vision_weights, out).items():
        if model not in a.models.split(","):
            continue
        adapter = registry.adapter(model)
        short = "ds" if model == DEEPSEEK else "qw"
        if not only or "clean" in only:
            for b in bl:
                jobs.append({"name": f"{short}-clean-{b['block']}", "model": model, "fault": None, "boundary": None,
                             "blocks": [b["block"]], "text": gate_text(f"clean {b['block']}", model, [b["model"]])})
        for f in adapter.faults:
            if only and f.name not in only:
                continue
            cb = carriers(adapter, f, bl)
            if not cb:
                jobs.append({"name": f"{short}-{f.name}", "model": model, "fault": f.name, "boundary": f.boundary,
                             "blocks": [], "text": "", "skip": "no block can carry it"})
                continue
            jobs.append({"name": f"{short}-{f.name}", "model": model, "fault": f.name, "boundary": f.boundary,
                         "blocks": [b["block"] for b in cb],
                         "text": gate_text(f"fault {f.name}", model, [b["model"] for b in cb])})
    env_note = {"device": a.device, "vision_weights": a.vision_weights, "workers": a.workers}
    try:
        import torch

        env_note["torch"] = torch.__version__
        if a.device.startswith("cuda") and torch.cuda.is_available():
            env_note["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    print(f"{len(jobs)} gates, {a.workers} at once", flush=True)
    t0 = time.perf_counter()
    rows: list[dict] = []

    def save():
        ordered = sorted(rows, key=lambda r: (r["model"], r["fault"] is not None, r["name"]))
        faults = [r for r in ordered if r.get("fault") and "skipped" not in r]
        clean = [r for r in ordered if not r.get("fault") and "skipped" not in r]
        summary = {"env": env_note, "faults_run": len(faults), "caught": sum(bool(r.get("caught")) for r in faults),
                   "agree": sum(bool(r.get("agree")) for r in faults), "clean_blocks": len(clean),
                   "clean_ok": sum(bool(r.get("clean_ok")) for r in clean),
                   "skipped": [r["name"] for r in ordered if "skipped" in r], "rows": ordered}
        (out / "fault_matrix.json").write_text(json.dumps(summary, indent=1))
        (out / "fault_matrix.md").write_text(markdown([r for r in ordered if "skipped" not in r]))
        return summary

    with ThreadPoolExecutor(max_workers=a.workers) as pool:
        futs = {}
        for j in jobs:
            if j.get("skip"):
                rows.append({**{k: j[k] for k in ("name", "model", "fault", "boundary", "blocks")}, "skipped": j["skip"]})
                continue
            futs[pool.submit(lambda j=j: (run_one(j, out, a.timeout_s)
                                          if time.perf_counter() - t0 < a.budget_s else None))] = j
        for fu in as_completed(futs):
            j, r = futs[fu], fu.result()
            if r is None:
                rows.append({**{k: j[k] for k in ("name", "model", "fault", "boundary", "blocks")},
                             "skipped": "time budget"})
                continue
            rows.append(r)
            tag = (("caught" if r.get("caught") else "NOT CAUGHT") + (", agree" if r.get("agree") else ", disagree")
                   if r.get("fault") else ("clean ok" if r.get("clean_ok") else "CLEAN FAILED"))
            print(f"[{time.perf_counter() - t0:6.1f}s] {r['name']}: exit {r['exit']} ({tag}) {r['seconds']} s", flush=True)
            save()
    s = save()
    print(f"faults caught {s['caught']}/{s['faults_run']}, origins agree {s['agree']}/{s['faults_run']}, "
          f"clean blocks ok {s['clean_ok']}/{s['clean_blocks']}, skipped {len(s['skipped'])}")
    return 0 if s["caught"] == s["faults_run"] and s["clean_ok"] == s["clean_blocks"] and not s["skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
