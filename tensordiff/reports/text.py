"""Reports a person reads: the earliest divergence first, then the boundary table.

`render_text` is plain (pipes, logs, pytest failures); `print_rich` draws the same content as a
rich table on a terminal. JSON lives on the result objects (`Report.as_json`).
"""
from __future__ import annotations

import math

from tensordiff.judge.result import Report, TensorResult
from tensordiff.judge.tolerance import Tolerance
from tensordiff.judge.metrics import ExactResult, FloatResult, TopKResult

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


def dtype_text(t: TensorResult) -> str:
    """A tensor's dtypes: one when both sides agree, `A vs B` otherwise; a side without the tensor
    says `missing`."""
    a, b = t.dtype.get("a") or "missing", t.dtype.get("b") or "missing"
    return f"{a}" if a == b else f"{a} vs {b}"


# The text table's columns take the width of their longest cell (and of their header), up to these
# caps; a longer cell is cut in the middle, the cut marked `…` (a tensor's name keeps both ends:
# its module and its last part).
CAPS = {"boundary": 32, "status": 24, "tensor": 44, "dtype": 24}


def fit(text: str, width: int) -> str:
    """`text` in at most `width` characters: whole, or its two ends around `…`."""
    if len(text) <= width:
        return text
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _table(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    """The boundary table's lines: four sized columns, then the metrics."""
    heads = tuple(CAPS)
    widths = [min(CAPS[h], max([len(h)] + [len(r[i]) for r in rows])) for i, h in enumerate(heads)]
    out = []
    for r in [(*heads, "metrics"), *rows]:
        cells = [fit(c, w).ljust(w) for c, w in zip(r, widths)]
        out.append(" ".join(cells + [r[4]]).rstrip())
    return out


def headline(r: Report) -> str:
    """The report's first line: the verdict, what the generated tokens did when they differ
    (`Report.generated`), and how a low-precision comparison without a floor was judged."""
    tokens = tokens_changed(r)
    two_way = " (two-way: no floor run, see the notes)" if r.judgement.get("kind") == "two-way" else ""
    if r.verdict == "match":
        benign = [b.name for b in r.boundaries if b.status == "benign"]
        cascade = [b.name for b in r.boundaries if b.status == "cascade"]
        tail = ""
        if benign:
            tail = f"; {len(benign)} choices flipped on near-ties only ({', '.join(benign[:4])}{'…' if len(benign) > 4 else ''})"
        if cascade:
            tail += (f", {len(cascade)} boundaries after them differ as that flip's cascade (judged by local error, "
                     "the engine's stage on the reference's tensors)")
        tokens = f"; {tokens}" if tokens else ""
        return f"MATCH: all {len(r.boundaries)} boundaries within tolerance ({r.model}){two_way}{tokens}{tail}"
    parts = []
    for n in r.earliest:
        b = r.boundary(n)
        parts.append(f"earliest divergence at `{n}` ({b.status}): {b.look_between}")
    if not parts:
        parts.append("diverged (no root found)")
    return "DIVERGED: " + "; ".join(parts) + (f"; {tokens}" if tokens else "") + two_way


GENERATED = {"benign": "a benign near-tie flip (the reference's own top choices there are within a right route's "
                       "rounding)",
             "cascade": "after an earlier near-tie flip, its cascade",
             "diverged": "not a near-tie: the choice itself diverged",
             "consequent": "a consequence of the divergence upstream"}


def tokens_changed(r: Report) -> str:
    """'the generated tokens differ from step K (why)' when they do, else ''."""
    g = r.generated
    if not g or g["first"] is None:
        return ""
    why = GENERATED.get(g["status"], g["status"])
    return f"the generated tokens differ from step {g['first']} on: {why}"


NO_EXPLANATION = ("no simple explanation (tested: rows moved, columns permuted, scale, sign, offset, a swapped "
                  "pair, sizes)")


def diagnosis_lines(b) -> list[str]:
    """What kind of wrong a diagnosed boundary is (`tensordiff.judge.diagnosis`), one line a finding."""
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
    lines = [headline(r), f"A (reference): {r.a}", f"B (candidate): {r.b}",
             *([f"dumps: {r.where}"] if r.where else []), f"tolerances: {r.tolerances}"]
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
    rows: list[tuple[str, str, str, str, str]] = []
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
            name = b.name if i == 0 else ""
            rows.append((name, status, "", "", "") if t is None else
                        (name, status, t.name, dtype_text(t), tensor_summary(t)))
    lines += _table(rows)
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
    console.print(f"A (reference): {escape(r.a)}\nB (candidate): {escape(r.b)}"
                  + (f"\ndumps: {escape(r.where)}" if r.where else ""), style="dim", highlight=False)
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
        rows = [(b.name if i == 0 else "", f"{b.status}{' (root)' if b.root else ''}" if i == 0 else "", t.name,
                 dtype_text(t), tensor_summary(t)) for b in r.boundaries for i, t in enumerate(b.tensors)]
        for line in _table(rows):
            console.print(escape(line), highlight=False)
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
            table.add_row(escape(b.name) if i == 0 else "", st, escape(t.name), escape(dtype_text(t)),
                          _g(m.get("max_abs")), f"{m['cosine']:.6f}" if "cosine" in m else "-",
                          _g(m.get("sqnr_db"), ".1f"), _g(m.get("ulp_p99")),
                          f"{100 * m['mismatch_fraction']:.3g}%" if "mismatch_fraction" in m else escape(t.reason or "-"))
    console.print(table)
    for note in r.notes:
        console.print(f"note: {escape(note)}", style="yellow")


# ----------------------------------------------------------------------------- a dump (`inspect`)

LIST_CAP = 16  # a list's items shown before `… (N in all)`


def plain(v) -> str:
    """A manifest value in plain words: `none`, `yes`/`no`, numbers, lists as `a, b, c` (lists of
    lists or tables as `a; b`), a table as `key value, key value`."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return format(v, "g")
    if isinstance(v, (list, tuple)):
        if not v:
            return "(empty)"
        sep = "; " if any(isinstance(x, (list, tuple, dict)) for x in v) else ", "
        more = f"{sep}… ({len(v)} in all)" if len(v) > LIST_CAP else ""
        return sep.join(plain(x) for x in v[:LIST_CAP]) + more
    if isinstance(v, dict):
        return ", ".join(f"{k} {plain(x)}" for k, x in v.items()) or "(empty)"
    return str(v)


def _flat(d: dict, prefix: str):
    """(dotted key, plain value) of every leaf of a manifest table."""
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", plain(v)


def dump_header(d) -> list[str]:
    """A dump's model, producer and run, one fact a line, keys aligned."""
    facts = [("model", plain(d.model)), *_flat(d.producer or {}, "producer."), *_flat(d.run or {}, "run.")]
    width = min(40, max(len(k) for k, _ in facts))
    return [f"dump {d.path}"] + [f"  {fit(k, width).ljust(width)}  {v}" for k, v in facts]


def shape_text(shape) -> str:
    """`216 × 1536`; `scalar` for a 0-d tensor."""
    return " × ".join(str(n) for n in shape) if len(shape) else "scalar"


def dump_table(rows: list[tuple[str, str, str, str, str, str]]) -> list[str]:
    """The tensors of a dump: (tensor, boundary, dtype, shape, MB, where stored), columns as wide as
    their contents (the name columns capped, cut in the middle and marked `…`)."""
    heads = ("tensor", "boundary", "dtype", "shape", "MB", "file")
    caps = (CAPS["tensor"], CAPS["boundary"], 12, 24, 12)
    widths = [min(c, max([len(h)] + [len(r[i]) for r in rows])) for i, (h, c) in enumerate(zip(heads, caps))]
    out = []
    for r in [heads, *rows]:
        cells = [fit(c, w).rjust(w) if i == 4 else fit(c, w).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append(" ".join(cells + [r[5]]).rstrip())
    return out
