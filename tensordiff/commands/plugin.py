"""pytest plugin (entry point `pytest11`): assert a produced dump against a baseline dump.

    def test_my_engine(tmp_path, tensordiff_baseline):
        run_my_engine(out=tmp_path / "dump")          # writes a tensordiff dump
        tensordiff_baseline.check(tmp_path / "dump")  # fails with the earliest-divergence report

The baseline lives next to the test module (`<module dir>/<module name>/<test name>.tensordiff/`)
unless a path is given. A missing baseline is written and the test fails saying so;
`--tensordiff-regen` rewrites baselines instead of asserting (like `--force-regen` in
pytest-regressions) and fails each test whose baseline it refreshed, so a regeneration never
passes; `--tensordiff-tolerances FILE` is the tolerance file of every check that names none.

A dump computed in bf16/fp16 is judged against its floor when one is given: the baseline is then
the float32 reference and `floor` the reference's own run in that precision (three-way,
row-aware, `tensordiff.pipeline.compare.three_way`). Without a floor a low-precision comparison is
two-way, and the report says so and what it cannot see (`Report.judgement`).

    tensordiff_baseline.check(tmp_path / "engine-bf16", baseline="ref-fp32", floor="ref-bf16")
"""
from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import pytest
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.compare import compare_dumps, three_way
from tensordiff.reports.text import render_text


def pytest_addoption(parser):
    group = parser.getgroup("tensordiff")
    group.addoption("--tensordiff-regen", action="store_true", default=False,
                    help="write or refresh tensordiff baselines instead of comparing against them")
    group.addoption("--tensordiff-tolerances", default=None,
                    help="TOML tolerance file for tensordiff baseline checks")


def pytest_configure(config):
    config.addinivalue_line("markers", "tensordiff: a test that checks dumps against tensordiff baselines")


class BaselineCheck:
    def __init__(self, request: pytest.FixtureRequest):
        self.request = request
        self.regen = request.config.getoption("--tensordiff-regen")
        self.tolerances = request.config.getoption("--tensordiff-tolerances")

    def default_path(self) -> Path:
        mod = Path(str(self.request.node.path))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.request.node.name)
        return mod.parent / mod.stem / f"{name}.tensordiff"

    def check(self, produced, baseline=None, tolerances=None, *, contract=None, floor=None):
        __tracebackhide__ = True

        produced = Path(produced)
        open_dump(produced)  # a broken produced dump fails here, clearly
        base = Path(baseline) if baseline else self.default_path()
        if floor is not None:  # three-way: the baseline is the float32 reference, `floor` its low-precision run
            if not base.exists():
                pytest.fail(f"tensordiff reference {base} does not exist: a check against a floor compares with the "
                            "float32 reference, which is never written from the produced dump", pytrace=False)
            report = three_way(base, Path(floor), produced, tolerances=tolerances or self.tolerances,
                               contract=contract)
            if report.verdict != "match":
                pytest.fail(render_text(report) + f"\n\nreference: {base}\nfloor run: {floor}", pytrace=False)
            return report
        if self.regen or not base.exists():
            existed = base.exists()
            tmp = base.with_name(base.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            base.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(produced, tmp)
            if existed:
                shutil.rmtree(base)
            tmp.rename(base)
            verb = "refreshed" if existed else "written"
            pytest.fail(f"tensordiff baseline {verb}: {base}\nRerun the test to compare against it.", pytrace=False)
        report = compare_dumps(base, produced, tolerances or self.tolerances, contract=contract)
        if report.verdict != "match":
            pytest.fail(render_text(report) + f"\n\nbaseline: {base}\nTo accept the new tensors: pytest --tensordiff-regen",
                        pytrace=False)
        if report.judgement.get("kind") == "two-way":  # a pass that could not see what a floor would
            warnings.warn(TwoWayWarning(f"{produced} against {base}: {report.judgement['note']}"), stacklevel=2)
        return report


class TwoWayWarning(UserWarning):
    """A low-precision dump passed a baseline check with no floor run: the verdict is two-way."""


@pytest.fixture
def tensordiff_baseline(request) -> BaselineCheck:
    """Compare a produced dump with its baseline; see `BaselineCheck.check`."""
    return BaselineCheck(request)
