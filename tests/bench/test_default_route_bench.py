"""bench/default_route.py: a fault counts as caught only at its own boundary with every local origin
agreeing, the clean table keeps a flip's cascade apart from the ratios the floor judged, and a
smoke run of the real route (CPU, synthetic:tiny, one picture, one fault) passes."""
from __future__ import annotations

import json

import tensordiff.models.deepseek_v41_flash.faults as D


def _row(fault=None, boundary=None, earliest=None, local=None, verdicts=None, x=None, cascade=None, passed=True,
         **kw):
    return {"model": "deepseek-v4.1-flash", "fault": fault, "boundary": boundary, "picture": "p", "chunk": None,
            "passed": passed, "earliest": earliest or {"semantic": [], "numeric": []},
            "verdicts": verdicts or {"semantic": "match", "numeric": "match"},
            "local_origin": local or {"semantic": None, "numeric": None},
            "local_ran": {p: o is not None for p, o in (local or {}).items()},
            "numeric_x": x or {}, "numeric_cascade_x": cascade or {}, **kw}


def test_a_fault_is_caught_only_at_its_boundary_with_agreeing_local_origins(bench):
    m = bench("default_route")
    right = _row(D.EMBED_LAST_ROW_SCALE, "embeddings", {"semantic": ["embeddings"], "numeric": []},
                 {"semantic": "embeddings", "numeric": None}, {"semantic": "diverged", "numeric": "match"}, passed=False)
    assert m.caught(right)[:2] == (True, "semantic")
    later = _row(D.EMBED_LAST_ROW_SCALE, "embeddings", {"semantic": ["attn.0"], "numeric": []},
                 {"semantic": "attn.0", "numeric": None}, {"semantic": "diverged", "numeric": "match"}, passed=False)
    assert m.caught(later)[0] is False  # a later symptom is not its boundary
    disagree = _row(D.ROUTER_LAST_ROW_RENORM, "router.0.weights", {"semantic": ["router.0.weights"], "numeric": []},
                    {"semantic": "router.0.weights", "numeric": "hidden.0"}, {"semantic": "diverged", "numeric": "match"})
    assert m.caught(disagree)[0] is False
    by_local = _row(D.ROUTER_LAST_ROW_RENORM, "router.0.weights", local={"semantic": None, "numeric": "router.0.weights"})
    assert m.caught(by_local)[:2] == (True, "numeric local error")
    assert m.caught({**right, "skipped": "time budget", "earliest": {}})[0] is False


def test_the_clean_table_keeps_cascades_apart(bench):
    m = bench("default_route")
    rows = [_row(x={"hidden.0": 1.1}), _row(x={"hidden.0": 1.3}, cascade={"hidden.1": 9.0}),
            _row(D.EMBED_LAST_ROW_SCALE, "embeddings", {"semantic": ["embeddings"], "numeric": ["embeddings"]},
                 {"semantic": "embeddings", "numeric": "embeddings"}, {"semantic": "diverged", "numeric": "diverged"},
                 passed=False, x_at_boundary=8.9)]
    text, out = m.tables(rows)
    worst = {w["boundary"]: w for w in out["worst"]}
    assert worst["hidden.0"]["x"] == 1.3 and worst["hidden.0"]["n"] == 2 and worst["hidden.0"]["cascade"] == 0
    assert worst["hidden.1"]["cascade"] == 1 and worst["hidden.1"]["cascade_x"] == 9.0 and worst["hidden.1"]["n"] == 0
    assert out["clean_pass"] == "2 of 2" and out["faults"][0]["ok"] and out["all_ok"]
    assert out["faults"][0]["caught_by"] == "semantic+numeric" and out["faults"][0]["x_at_boundary"] == 8.9


def test_a_smoke_run_of_the_default_route(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    m = bench("default_route")
    code = m.main(["--models", "deepseek-v4.1-flash", "--images", "astronaut", "--chunks", "none", "--decode", "2",
                   "--faults", D.EMBED_LAST_ROW_SCALE, "--work", str(tmp_path / "w"), "--json", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and rep["summary"]["all_ok"], rep["summary"]
    (clean,) = [c for c in rep["cases"] if c["fault"] is None]
    assert clean["passes"] == ["semantic", "numeric"] and clean["numeric_x"]
    (fault,) = rep["summary"]["faults"]
    assert fault["boundary"] == "embeddings" and fault["local_origin"]["semantic"] == "embeddings"
