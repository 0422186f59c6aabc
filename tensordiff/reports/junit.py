"""JUnit XML: one test case per model × image × boundary, so any CI shows which boundary broke.

    write_junit(cases, "gate.xml")

A case is anything with `.label` (e.g. "deepseek-v4.1-flash / cat.png / float32"), `.report`
(a `Report`, or None when the case could not run), `.error` (why not) and optionally `.local`
(a `LocalReport`) and `.timings`. `case_of(report)` wraps a lone report (compare, check).

Everything in a report can come from an untrusted manifest (tensor and model names, producer
strings, notes): ElementTree escapes markup, and characters XML 1.0 cannot carry at all (NUL and
other C0 controls) are replaced, so the file always parses.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tensordiff.format.storage import write_text_atomic
from tensordiff.reports.text import diagnosis_lines, headline, tensor_summary
from tensordiff.judge.result import FAILING, Report

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def clean(s) -> str:
    """A string XML 1.0 can hold (ElementTree escapes <, >, &, quotes; it does not drop controls)."""
    return _XML_BAD.sub("\ufffd", str(s))


@dataclass
class LoneCase:
    label: str
    report: Report | None
    error: str | None = None
    local: object | None = None
    timings: dict = field(default_factory=dict)


def case_of(report: Report, label: str | None = None) -> LoneCase:
    return LoneCase(label or f"{report.model}: {report.a} vs {report.b}", report)


def _classname(label: str) -> str:
    # CI tools split classnames at dots into packages; keep the label whole and readable.
    return clean(label).replace(".", "_")


def _boundary_case(suite: ET.Element, label: str, b, local, prefix: str = "") -> tuple[int, int]:
    tc = ET.SubElement(suite, "testcase", classname=_classname(label), name=clean(prefix + b.name), time="0")
    lines = [f"{t.name}: {t.status}: {tensor_summary(t)}" for t in b.tensors] + diagnosis_lines(b)
    lr = local.get(b.name) if local else None
    if lr is not None:
        lines.append(f"local error (engine stage on the oracle's inputs): {lr.status}"
                     + (f": {lr.reason}" if lr.reason else ""))
    failures = skipped = 0
    if b.status in FAILING or b.status == "consequent":
        kind = "root" if b.root else b.status
        msg = f"{b.status}{' (earliest)' if b.root else ''}: {b.reason or b.look_between}"
        if b.root:
            msg += f"; {b.look_between}"
            msg += "".join(f"; {d}" for d in diagnosis_lines(b))
        f = ET.SubElement(tc, "failure", type=clean(kind), message=clean(msg))
        f.text = clean("\n".join(lines))
        failures = 1
    elif lr is not None and lr.status == "diverged":
        f = ET.SubElement(tc, "failure", type="local", message=clean(f"local error diverged: {lr.reason}"))
        f.text = clean("\n".join(lines))
        failures = 1
    elif b.status == "skipped":
        ET.SubElement(tc, "skipped", message="not compared (--fail-fast stopped earlier)")
        skipped = 1
    out = ET.SubElement(tc, "system-out")
    out.text = clean("\n".join(lines))
    return failures, skipped


def build(cases, name: str = "tensordiff") -> ET.Element:
    root = ET.Element("testsuites", name=clean(name))
    total = fails = errs = skips = 0
    total_time = 0.0
    for case in cases:
        label = clean(case.label)
        suite = ET.SubElement(root, "testsuite", name=label)
        timings = getattr(case, "timings", None) or {}
        t_case = float(sum(v for v in timings.values() if isinstance(v, (int, float))))
        n = f = e = s = 0
        if case.report is None:
            tc = ET.SubElement(suite, "testcase", classname=_classname(case.label), name="run", time=f"{t_case:.3f}")
            err = ET.SubElement(tc, "error", type="error", message=clean(case.error or "the case did not run"))
            err.text = clean(case.error or "")
            n, e = 1, 1
        else:
            local = getattr(case, "local", None)
            by_local = {r.boundary: r for r in local.boundaries} if local is not None else None
            for b in case.report.boundaries:
                ff, ss = _boundary_case(suite, case.label, b, by_local)
                n, f, s = n + 1, f + ff, s + ss
            numeric = getattr(case, "numeric", None)  # the gate's numeric pass beside the semantic one
            for b in (numeric.boundaries if numeric is not None else ()):
                ff, ss = _boundary_case(suite, case.label, b, None, prefix="numeric: ")
                n, f, s = n + 1, f + ff, s + ss
            props = ET.SubElement(suite, "properties")
            if getattr(case, "passes", ()):
                ET.SubElement(props, "property", name="passes", value=clean(", ".join(case.passes)))
            if numeric is not None:
                ET.SubElement(props, "property", name="numeric_verdict", value=clean(numeric.verdict))
                ET.SubElement(props, "property", name="numeric_headline", value=clean(headline(numeric)))
            ET.SubElement(props, "property", name="verdict", value=clean(case.report.verdict))
            ET.SubElement(props, "property", name="headline", value=clean(headline(case.report)))
            ET.SubElement(props, "property", name="earliest", value=clean(",".join(case.report.earliest)))
            if local is not None:
                ET.SubElement(props, "property", name="local_origin", value=clean(local.origin or ""))
            for k, v in timings.items():
                ET.SubElement(props, "property", name=clean(f"time.{k}"), value=f"{v:.3f}")
            for note in case.report.notes:
                ET.SubElement(props, "property", name="note", value=clean(note))
        suite.set("tests", str(n))
        suite.set("failures", str(f))
        suite.set("errors", str(e))
        suite.set("skipped", str(s))
        suite.set("time", f"{t_case:.3f}")
        total, fails, errs, skips, total_time = total + n, fails + f, errs + e, skips + s, total_time + t_case
    root.set("tests", str(total))
    root.set("failures", str(fails))
    root.set("errors", str(errs))
    root.set("skipped", str(skips))
    root.set("time", f"{total_time:.3f}")
    return root


def render_junit(cases, name: str = "tensordiff") -> str:
    root = build(cases, name)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(cases, path: str | Path, name: str = "tensordiff") -> None:
    write_text_atomic(path, render_junit(cases, name), "the JUnit report")
