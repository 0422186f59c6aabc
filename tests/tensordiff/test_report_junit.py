"""JUnit XML: one test case per boundary, parseable, every untrusted string escaped."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.reports.junit import case_of, render_junit, write_junit
from tensordiff.judge.result import BoundaryResult, Report, TensorResult

DUMPS = Path(__file__).resolve().parents[2] / "dumps"
EVIL = '<script>alert("x")</script>&\x01"\''


def test_sample_dumps_one_testcase_per_boundary(tmp_path):
    r = compare_dumps(DUMPS / "sample-oracle", DUMPS / "sample-engine")
    write_junit([case_of(r, "sample")], tmp_path / "r.xml")
    root = ET.parse(tmp_path / "r.xml").getroot()
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["patches", "rope", "block0", "final_norm", "aligner"]
    kinds = {c.get("name"): (c.find("failure").get("type") if c.find("failure") is not None else None) for c in cases}
    assert kinds == {"patches": None, "rope": "root", "block0": "consequent", "final_norm": "consequent",
                     "aligner": "consequent"}
    assert root.get("tests") == "5" and root.get("failures") == "4" and root.get("errors") == "0"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["verdict"] == "diverged" and props["earliest"] == "rope"


def test_matching_report_has_no_failures():
    t = TensorResult("x", "b", "match", metrics={"numel": 1, "mismatches": 0})
    r = Report("a", "b", "m", [BoundaryResult("b", "match", tensors=[t])])
    root = ET.fromstring(render_junit([case_of(r)]))
    assert root.get("failures") == "0" and root.find(".//testcase").get("name") == "b"


def test_case_that_did_not_run_is_an_error():
    class Case:
        label, report, error = "m / img", None, "weights missing: vision.norm.weight"

    root = ET.fromstring(render_junit([Case()]))
    err = root.find(".//error")
    assert root.get("errors") == "1" and "vision.norm.weight" in err.get("message")


def test_planted_markup_in_names_is_escaped_and_round_trips():
    t = TensorResult(EVIL, EVIL, "diverged", reason=EVIL, metrics={"numel": 4, "mismatches": 4})
    b = BoundaryResult(EVIL, "diverged", root=True, tensors=[t], reason=EVIL)
    r = Report(EVIL, EVIL, EVIL, [b], notes=[EVIL])
    xml = render_junit([case_of(r, EVIL)], name=EVIL)
    assert "<script>" not in xml
    root = ET.fromstring(xml)  # parses: controls replaced, markup escaped
    tc = root.find(".//testcase")
    assert tc.get("name") == EVIL.replace("\x01", "\ufffd")
    assert "<script>" in tc.find("failure").get("message")  # the text survives, as text


def test_planted_markup_in_a_dump_manifest(tmp_path):
    # names are validated by the reader; model, producer and run strings are free text
    for side in ("oracle", "engine"):
        d = tmp_path / side
        shutil.copytree(DUMPS / f"sample-{side}", d)
        m = json.loads((d / "manifest.json").read_text())
        m["model"] = "<script>alert(1)</script>"
        m["producer"]["name"] = "<img src=x onerror=alert(1)>"
        m["run"]["dtype"] = "<b>" + side
        (d / "manifest.json").write_text(json.dumps(m))
    r = compare_dumps(tmp_path / "oracle", tmp_path / "engine")
    xml = render_junit([case_of(r)])
    assert "<script>" not in xml and "<img" not in xml and "<b>" not in xml
    root = ET.fromstring(xml)
    assert root.find("testsuite").get("name").startswith("<script>alert(1)</script>")
