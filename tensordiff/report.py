"""Reports a person reads: the earliest divergence first, then the boundary table.

`render_text` is plain (pipes, logs, pytest failures); `print_rich` draws the same content as a
rich table on a terminal. JSON lives on the result objects (`Report.as_json`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .result import Report, TensorResult
from .tolerance import Tolerance

MARK = {"match": "ok", "diverged": "DIVERGED", "consequent": "consequent", "missing": "MISSING",
        "incomparable": "INCOMPARABLE", "skipped": "skipped", "benign": "benign (tie)", "cascade": "cascade"}


def _g(x, fmt=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def tensor_summary(t: TensorResult) -> str:
    from .metrics import ExactResult, FloatResult, TopKResult

    m = t.metrics
    if t.status in ("missing", "incomparable"):
        return t.reason
    if t.mode == "floor":
        return floor_summary(m)
    if isinstance(m, FloatResult):
        s = ""
        if m.numel and not m.finite_pairs and not m.nonfinite_mismatch:
            return (f"no finite element on either side (NaN: A {m.nan[0]}, B {m.nan[1]}; Inf: A {m.inf[0]}, "
                    f"B {m.inf[1]}): nothing compared")
        if m.nonfinite_mismatch:  # the metrics below see only the finite pairs: say so first
            s = (f"{m.nonfinite_mismatch} NaN/Inf on one side only (NaN: A {m.nan[0]}, B {m.nan[1]}); "
                 "finite pairs: ")
        max_abs = m.finite_max_abs if m.nonfinite_mismatch else m.max_abs
        s += (f"max|Δ| {_g(max_abs)}  mean|Δ| {_g(m.mean_abs)}  cos {m.cosine:.6f}  "
              f"SQNR {_g(m.sqnr_db, '.1f')} dB  ULP p50/p99/max {_g(m.ulp_p50)}/{_g(m.ulp_p99)}/{_g(m.ulp_max)}"
              f" ({m.ulp_unit})  outside {100 * m.mismatch_fraction:.3g}%")
        floor = t.tolerance.get("floor")
        if floor:
            s += f"  = {m.max_abs / floor:.3g}× floor"
        if t.tolerance.get("atol_scale"):  # a magnitude-aware atol: the value it was judged by
            s += f"  atol {Tolerance.from_dict(t.tolerance).atol_text()}"
        return s
    if isinstance(m, TopKResult):
        out = f"{m.rows_differ}/{m.rows} rows differ as sets, overlap {m.mean_overlap:.3f}"
        if m.ties:
            out += f"; {m.ties['benign']} near-ties (largest benign margin {_g(m.ties['max_benign_margin'])})"
        return out
    if isinstance(m, ExactResult):
        return f"{m.mismatches}/{m.numel} elements differ"
    if t.mode == "scores":
        return t.reason
    return "0/0 elements differ"


def floor_summary(m: dict) -> str:
    """A numeric-pass tensor: its error as multiples of the floor, and what the pass can see."""
    if m.get("exact_floor"):
        return (f"bit-exact across precisions: exact required; engine RMSE {_g(m['engine']['rmse'])}"
                + ("" if m["engine"]["rmse"] else " (exact)"))
    r, d = m["ratios"], m["detectable"]
    w = (m.get("worst_rows") or [None])[0]
    worst = f"  worst row {w['row']} ({w['meaning']}) {w['x_floor']:.3g}× its floor" if w else ""
    return (f"× floor: RMSE {r['rmse']:.3f}  max row {r['row']:.3f}  cos deficit {r['cosine']:.3f}  "
            f"outlier rows {m['outliers']}/{m['rows']}{worst}  (floor rel. RMSE {m['floor']['relative']:.3g}; "
            f"detectable: {100 * d['tensor']:.3g}% tensor-wide, {100 * d['row']:.3g}% in one row)")


def _dtype_note(t: TensorResult) -> str:
    a, b = t.dtype.get("a"), t.dtype.get("b")
    return f"{a}" if a == b else f"{a} vs {b}"


def headline(r: Report) -> str:
    if r.verdict == "match":
        benign = [b.name for b in r.boundaries if b.status == "benign"]
        cascade = [b.name for b in r.boundaries if b.status == "cascade"]
        tail = ""
        if benign:
            tail = f"; {len(benign)} choices flipped on near-ties only ({', '.join(benign[:4])}{'…' if len(benign) > 4 else ''})"
        if cascade:
            tail += (f", {len(cascade)} boundaries after them differ as that flip's cascade (judged by local error, "
                     "the engine's stage on the reference's tensors)")
        return f"MATCH: all {len(r.boundaries)} boundaries within tolerance ({r.model}){tail}"
    parts = []
    for n in r.earliest:
        b = r.boundary(n)
        parts.append(f"earliest divergence at `{n}` ({b.status}): {b.look_between}")
    if not parts:
        parts.append("diverged (no root found)")
    return "DIVERGED: " + "; ".join(parts)


NO_EXPLANATION = ("no simple explanation (tested: rows moved, columns permuted, scale, sign, offset, a swapped "
                  "pair, sizes)")


def diagnosis_lines(b) -> list[str]:
    """What kind of wrong a diagnosed boundary is (`tensordiff.diagnosis`), one line a finding."""
    if b.diagnosis is None:
        return []
    if not b.diagnosis:
        return [f"diagnosis: {NO_EXPLANATION}"]
    return [f"diagnosis: {f['line']}" for f in b.diagnosis]


def diagnosis_brief(r: Report) -> str:
    """The roots' findings in a few words, for a one-line summary (the gate's progress)."""
    parts = [f"`{b.name}` {f['name']} ({100 * f['explained']:.0f}%)" for b in r.boundaries if b.root
             for f in (b.diagnosis or [])]
    return f"; diagnosis: {', '.join(parts)}" if parts else ""


ULP_INF_NOTE = ("ULP inf: more of the reference value's ULPs than a float32 can count; the reference is 0 "
                "or subnormal there (one ULP ~1e-45), so read max|Δ| for that tensor")


def render_text(r: Report, max_rows: int | None = 200) -> str:
    """The report as plain text; the table stops after `max_rows` rows (None: all of them) and
    says how many it left out."""
    lines = [headline(r), f"A (reference): {r.a}", f"B (candidate): {r.b}", f"tolerances: {r.tolerances}"]
    for n in r.earliest:
        b = r.boundary(n)
        for t in b.tensors:
            if t.status != "match":
                lines.append(f"  {t.name}: {t.reason}")
                if t.worst and t.mode == "floor":
                    lines.append(f"    worst row {t.worst['index']}: {t.worst['meaning']} ({t.worst['x_floor']:.3g}× floor)")
                elif t.worst:
                    w = t.worst
                    vals = f" (A={_g(w.get('a'), '.6g')}, B={_g(w.get('b'), '.6g')})" if "a" in w else ""
                    lines.append(f"    worst element {w['index']}: {w['meaning']}{vals}")
        lines += [f"  {d}" for d in diagnosis_lines(b)]
    lines.append("")
    lines.append(f"{'boundary':<22} {'status':<13} {'tensor':<22} {'dtype':<20} metrics")
    shown = total = 0
    ulp_inf = False
    for b in r.boundaries:
        for i, t in enumerate(b.tensors or [None]):
            total += 1
            if max_rows is not None and shown >= max_rows:
                continue
            shown += 1
            ulp_inf |= t is not None and any(isinstance(t.metrics.get(k), float) and math.isinf(t.metrics[k])
                                             for k in ("ulp_p50", "ulp_p99", "ulp_max"))
            status = MARK[b.status] + (" (root)" if b.root else "") if i == 0 else ""
            if t is None:
                lines.append(f"{b.name if i == 0 else '':<22} {status:<13}")
                continue
            lines.append(f"{b.name if i == 0 else '':<22} {status:<13} {t.name:<22} {_dtype_note(t):<20} {tensor_summary(t)}")
    if total > shown:
        lines.append(f"... {total - shown} more rows not shown (of {total}); see --json for all of them, or pass --all")
    if ulp_inf:
        lines.append(f"note: {ULP_INF_NOTE}")
    for note in r.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def print_rich(r: Report, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    style = "bold green" if r.verdict == "match" else "bold red"
    console.print(escape(headline(r)), style=style)
    for n in r.earliest:
        for t in r.boundary(n).tensors:
            if t.status != "match":
                console.print(f"  [bold]{escape(t.name)}[/]: {escape(t.reason)}")
                if t.worst:
                    what = "row" if t.mode == "floor" else "element"
                    console.print(f"    worst {what} {t.worst['index']}: {escape(t.worst['meaning'])}")
        for d in diagnosis_lines(r.boundary(n)):
            console.print(f"  [bold]{escape(d)}[/]")
    if any(t.mode == "floor" for b in r.boundaries for t in b.tensors):  # a numeric-pass report
        for b in r.boundaries:
            for i, t in enumerate(b.tensors):
                mark = f"{b.status}{' (root)' if b.root else ''}" if i == 0 else ""
                console.print(f"{escape(b.name if i == 0 else ''):<16} {escape(mark):<16} {escape(t.name):<18} "
                              f"{escape(tensor_summary(t))}", highlight=False)
        return
    table = Table(show_lines=False, header_style="bold")
    for col in ("boundary", "status", "tensor", "dtype", "max|Δ|", "cos", "SQNR dB", "ULP p99", "outside"):
        table.add_column(col)
    colors = {"match": "green", "diverged": "red", "consequent": "yellow", "missing": "red",
              "incomparable": "red", "skipped": "dim", "benign": "cyan", "cascade": "cyan"}
    for b in r.boundaries:
        for i, t in enumerate(b.tensors):
            m = t.metrics
            st = f"[{colors[b.status]}]{b.status}{' (root)' if b.root else ''}[/]" if i == 0 else ""
            table.add_row(escape(b.name) if i == 0 else "", st, escape(t.name), escape(_dtype_note(t)),
                          _g(m.get("max_abs")), f"{m['cosine']:.6f}" if "cosine" in m else "-",
                          _g(m.get("sqnr_db"), ".1f"), _g(m.get("ulp_p99")),
                          f"{100 * m['mismatch_fraction']:.3g}%" if "mismatch_fraction" in m else escape(t.reason or "-"))
    console.print(table)
    for note in r.notes:
        console.print(f"note: {escape(note)}", style="yellow")


def write_json(r: Report, path: str | Path) -> None:
    from .storage import write_text_atomic

    write_text_atomic(path, json.dumps(r.as_json(), indent=1) + "\n", "the JSON report")
