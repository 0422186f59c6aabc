"""bench/language_verdict.py's summary and plan (the whole script on the CPU,
`python bench/language_verdict.py OUT --device cpu --cases smoke --workers 2`, is too slow for the
suite): the clean table keeps a near-tie flip's cascade apart from the ratios the floor judged, a
fault counts as caught only at its own boundary (end to end in a pass, or as local error's origin),
and the plan covers every chunk on every picture."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import tensordiff.models.deepseek_v41_flash.faults as D

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _module():
    spec = importlib.util.spec_from_file_location("language_verdict", BENCH / "language_verdict.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(case, status, x, fault=None, earliest=None, local=None, exit=0):
    return {"case": case, "exit": exit, "fault": fault, "verdicts": {"semantic": "match"},
            "earliest": earliest or {"semantic": [], "numeric": []}, "local_origin": local,
            "numeric_boundaries": {"hidden.0": {"status": status, "floor_relative": 0.08, "x_rmse": x, "x_row": x,
                                                "x_cosine": x}}}


def test_the_summary_keeps_cascades_apart_and_faults_at_their_boundary(tmp_path):
    rows = [_row("clean-a-c64", "match", 1.0), _row("clean-b-c64", "match", 1.2), _row("clean-c-c1", "cascade", 9.0),
            _row(f"fault-{D.ROUTER_BIASED_WEIGHTS}", "cascade", 3.0, D.ROUTER_BIASED_WEIGHTS,
                 local="router.0.weights", exit=1),
            _row(f"fault-{D.ROUTER_TEXT_BIAS_FOR_IMAGES}", "match", 1.0, D.ROUTER_TEXT_BIAS_FOR_IMAGES,
                 earliest={"semantic": ["hidden.0"]}, exit=1),  # a later symptom, not its boundary
            {"case": "clean-d-c5", "exit": None, "skipped": "time budget"}]
    _module().summarise({"device": "cpu", "weights": "synthetic:tiny", "passes": ["semantic", "numeric"],
                         "cases": rows, "seconds": 1.0}, tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    h = s["clean_numeric_table"]["hidden.0"]
    assert h["x_rmse"] == {"min": 1.0, "median": 1.1, "max": 1.2, "n": 2}
    assert h["cascade_x_rmse"]["max"] == 9.0 and h["floor_relative"]["n"] == 3
    caught = {f["fault"]: f["caught_at_boundary"] for f in s["faults"]}
    assert caught == {D.ROUTER_BIASED_WEIGHTS: True, D.ROUTER_TEXT_BIAS_FOR_IMAGES: False}
    assert s["clean_exit_0"] == "3 of 3"
    md = (tmp_path / "summary.md").read_text()
    assert "| clean-d-c5 | skipped |" in md and "| hidden.0 | 0.08 |" in md


def test_the_plan_covers_every_chunk_on_every_picture_distinct_pictures_first():
    from types import SimpleNamespace

    mod = _module()
    images = [Path(f"/p/{n}.{'jpg' if i % 2 == 0 else 'png'}") for i, n in enumerate(mod.PHOTOS + ("wide", "tall"))]

    def spec(image, chunk, fault=None, **kw):
        return (image.stem, chunk, fault) + ((kw["weights"],) if "weights" in kw else ())

    a = SimpleNamespace(cases="all", only_ckpt=False, ckpt=None, layers="2")
    plan = mod.plan_cases(a, images, spec)
    names = [n for n, _ in plan]
    assert len(names) == len(set(names))
    clean = [s for n, s in plan if n.startswith("clean-") and not n.endswith("-fp8")]
    assert ("astronaut", 64, None, "synthetic:tiny-fp8") in [s for _, s in plan]  # the quantised clean case
    assert {(p, c) for p, c, _ in clean} == {(p.stem, c) for p in images for c in (64, None, 5, 1)}
    assert [s[0] for s in clean[:len(images)]] == [p.stem for p in images]  # one of each picture first
    faults = {s[2]: s for n, s in plan if n.startswith("fault-")}
    assert set(faults) == {f.name for f in D.LANGUAGE_FAULTS}  # every language fault of the table
    assert faults[D.OVERLAY_CHUNK_SHIFT][1] == 5 and faults[D.FP8_SCALE_IGNORED][3] == "synthetic:tiny-fp8"
    smoke = mod.plan_cases(SimpleNamespace(**{**vars(a), "cases": "smoke"}),
                           images, spec)
    assert [s for _, s in smoke] == [("astronaut", 64, None), ("astronaut", 64, mod.FAULTS[-1])]
