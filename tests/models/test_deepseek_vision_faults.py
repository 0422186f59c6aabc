"""Every planted engine fault is named by the comparator at its own boundary, and only there.

The default picture (1024x701) is chosen so that every fault changes numbers: its contain
rounding differs between round (709 rows) and ceil (710), and its 51x74 patch grid is not a
multiple of 3 wide (the flat-pad fault shifts rows).
"""
from __future__ import annotations

import dataclasses

import pytest

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.pipeline.registry import adapter
from tensordiff.pipeline.runs import make_request, run_side
import tensordiff.models.deepseek_v41_flash.faults as D

MODEL = "deepseek-v4.1-flash"
LANGUAGE = D.LANGUAGE_NAMES  # need a prompt: tests/models/test_deepseek_whole_model.py
FAULTS = [(f.name, f.boundary) for f in adapter(MODEL).faults if f.name not in LANGUAGE]


@pytest.fixture(scope="module")
def oracle_dump(module_tmp):
    ad, req = make_request(MODEL, weights="synthetic:tiny")
    return run_side(ad, "oracle", req, module_tmp("ds-oracle") / "oracle")


def test_adapter_lists_the_engine_faults():
    from engine.deepseek_v41_flash.faults import LANGUAGE as ENGINE_LANGUAGE
    from engine.deepseek_v41_flash.faults import VISION as ENGINE

    assert [n for n, _ in FAULTS] == list(ENGINE)
    assert len(FAULTS) == 9  # 5 semantic faults + 4 numeric ones (faults.NUMERIC)
    assert {f.name for f in adapter(MODEL).faults} - {n for n, _ in FAULTS} == set(ENGINE_LANGUAGE) == set(LANGUAGE)


@pytest.mark.parametrize("fault,boundary", FAULTS)
def test_fault_is_localised(fault, boundary, oracle_dump, tmp_path):
    ad, req = make_request(MODEL, weights="synthetic:tiny", fault=fault)
    engine = run_side(ad, "engine", req, tmp_path / "engine")
    report = compare_dumps(oracle_dump, engine)
    assert report.verdict == "diverged"
    assert report.earliest == [boundary], str(report)
    order = [b.name for b in report.boundaries]
    for b in report.boundaries:  # everything before the root matches
        if order.index(b.name) < order.index(boundary) and b.name not in ("rope", "patches"):
            assert b.status == "match", (fault, b.name, b.status)


def test_clean_engine_on_the_same_picture_matches(oracle_dump, tmp_path):
    ad, req = make_request(MODEL, weights="synthetic:tiny")
    engine = run_side(ad, "engine", dataclasses.replace(req), tmp_path / "engine")
    assert compare_dumps(oracle_dump, engine).verdict == "match"


def test_cli_check_exits_1_and_names_the_boundary(tmp_path, capsys):
    import json

    from tensordiff.commands.cli import main

    with pytest.raises(SystemExit) as e:
        main(["check", MODEL, "--fault", D.CONTAIN_CEIL, "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    # the resize decision itself is the one root: `plan` (patches, rope follow from it)
    assert e.value.code == 1 and "`plan`" in out.splitlines()[0]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert (rep.get("report") or rep)["earliest"] == ["plan"]
