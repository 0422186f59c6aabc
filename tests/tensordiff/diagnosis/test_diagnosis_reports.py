"""The diagnosis in every report a person or a CI tool reads: text, JSON, HTML, JUnit; and
only where something was tested."""
from __future__ import annotations

import json

import numpy as np
from conftest import rand

from tensordiff.pipeline.case import lone_case, write_reports
from tensordiff.reports.text import render_text


def test_text_json_html_and_junit_carry_the_finding(compare, tmp_path):
    a = rand(64, 16)
    r = compare({"x": a}, {"x": -a})
    line = r.boundary("x").diagnosis[0]["line"]
    assert line == "x: B equals A with its sign flipped (B = -A); explains 100% of the error"
    assert f"  diagnosis: {line}" in render_text(r).splitlines()
    js = r.as_json()
    assert js["diagnosis"]["x"][0]["name"] == "sign-flip"
    assert js["boundaries"][1]["diagnosis"][0]["explained"] == 1.0 and js["boundaries"][0]["diagnosis"] is None
    write_reports(report_json=js, json_path=tmp_path / "r.json", cases=[lone_case(r)], junit_path=tmp_path / "r.xml",
                  html_path=tmp_path / "r.html")
    assert json.loads((tmp_path / "r.json").read_text())["diagnosis"]["x"][0]["line"] == line
    assert "sign flipped" in (tmp_path / "r.html").read_text()
    assert "diagnosis: x: B equals A with its sign flipped" in (tmp_path / "r.xml").read_text()


def test_no_simple_explanation_is_said(compare):
    a = rand(64, 16)
    r = compare({"x": a}, {"x": a + rand(64, 16, seed=9)})
    assert r.boundary("x").diagnosis == [] and r.as_json()["diagnosis"] == {"x": []}
    assert "  diagnosis: no simple explanation" in render_text(r)


def test_an_integer_tensor_too_large_to_test_is_not_claimed_to_be_tested(compare, monkeypatch):
    from tensordiff.judge.diagnosis import run

    monkeypatch.setattr(run, "INT_MAX", 100)
    ids = np.arange(400, dtype=np.int64).reshape(100, 4)
    r = compare({"x": ids}, {"x": ids + 1})
    assert r.earliest == ["x"] and r.boundary("x").diagnosis is None and "diagnosis:" not in render_text(r)


def test_a_failing_diagnosis_is_a_note_and_the_verdict_stands(compare, monkeypatch):
    from tensordiff.judge.diagnosis import run

    def broken(*a, **k):
        raise RuntimeError("planted")

    monkeypatch.setattr(run, "diagnose_boundary", broken)
    a = rand(32, 8)
    r = compare({"x": a}, {"x": -a})
    assert r.verdict == "diverged" and r.earliest == ["x"] and r.boundary("x").diagnosis is None
    assert "the diagnosis of `x` failed (RuntimeError: planted)" in r.notes
